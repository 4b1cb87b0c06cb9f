// cpuaccel dashboard: the run page's three uPlot charts (loss, samples/s from 0,
// gradient-sync share in %), fed with only the new points of each poll (app.js).
"use strict";
(function () {
  const KEEP = 6000; // points kept per chart; beyond, every 2nd is dropped (last kept)
  const byId = (id) => document.getElementById(id);

  window.cpuaccelCharts = {
    plots: [],
    data: { step: [], loss: [], rate: [], sync: [] },

    make() {
      const axisFont = "11px system-ui, sans-serif";
      const base = (label, color, fromZero) => ({
        width: 400,
        height: 200,
        legend: { show: true },
        cursor: { drag: { x: true, y: false } },
        scales: {
          x: { time: false },
          y: fromZero ? { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } : { auto: true },
        },
        axes: [
          { label: "step", font: axisFont, labelFont: axisFont, size: 36, labelSize: 14 },
          { font: axisFont, size: 56 },
        ],
        series: [
          { label: "step" },
          { label: label, stroke: color, width: 1.5, spanGaps: true, points: { show: false } },
        ],
      });
      const empty = [[], []];
      this.plots = [
        new uPlot(base("loss", "#c0392b", false), empty, byId("chart-loss")),
        new uPlot(base("samples/s", "#2471a3", true), empty, byId("chart-rate")),
        new uPlot(base("sync %", "#7d3c98", true), empty, byId("chart-sync")),
      ];
      this.resize();
      let pending = 0;
      window.addEventListener("resize", () => {
        clearTimeout(pending);
        pending = setTimeout(() => this.resize(), 150);
      });
    },

    resize() {
      for (const plot of this.plots) {
        const width = Math.max(240, plot.root.parentElement.clientWidth - 4);
        plot.setSize({ width: width, height: 220 });
      }
    },

    drop() {
      this.data = { step: [], loss: [], rate: [], sync: [] };
    },

    // New columns from the server (only the lines after `since`): appended.
    add(metrics) {
      const steps = metrics.step || [];
      if (!steps.length) return false;
      const d = this.data;
      const pct = (v) => (v === null || v === undefined ? null : v * 100);
      for (let i = 0; i < steps.length; i++) {
        d.step.push(steps[i]);
        d.loss.push((metrics.loss || [])[i] ?? null);
        d.rate.push((metrics.samples_per_s || [])[i] ?? null);
        d.sync.push(pct((metrics.sync_share || [])[i]));
      }
      if (d.step.length > KEEP) this.thin();
      return true;
    },

    // A long live run keeps the charts bounded: every 2nd point dropped, the last kept.
    thin() {
      const d = this.data;
      const last = d.step.length - 1;
      const keep = (arr) => arr.filter((_, i) => i % 2 === 0 || i === last);
      this.data = { step: keep(d.step), loss: keep(d.loss), rate: keep(d.rate), sync: keep(d.sync) };
    },

    draw() {
      const d = this.data;
      this.plots[0].setData([d.step, d.loss]);
      this.plots[1].setData([d.step, d.rate]);
      this.plots[2].setData([d.step, d.sync]);
      byId("charts").dataset.points = String(d.step.length);
    },
  };
})();
