// cpuaccel dashboard: the run page's three uPlot charts (loss, samples/s from 0,
// gradient-sync share in %), fed with only the new points of each poll (app.js).
// The samples/s axis is fitted to the steps after the warm-up (the metrics' first
// line, as report's medians leave it out): a warm-up spike above them is clipped,
// and the legend says so.
"use strict";
(function () {
  const KEEP = 6000; // points kept per chart; beyond, every 2nd is dropped (last kept)
  const byId = (id) => document.getElementById(id);

  window.cpuaccelCharts = {
    plots: [],
    data: { step: [], loss: [], rate: [], sync: [] },
    warmup: 1, // the first points that are the warm-up (the server's "warmup")
    rateTop: 1, // the samples/s axis's top: the steady points' highest, plus 10%

    make() {
      const axisFont = "11px system-ui, sans-serif";
      const base = (label, color, fromZero, top) => ({
        width: 400,
        height: 200,
        legend: { show: true },
        cursor: { drag: { x: true, y: false } },
        scales: {
          x: { time: false },
          y: top ? { range: () => [0, this.rateTop] }
            : fromZero ? { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } : { auto: true },
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
        new uPlot(base("samples/s", "#2471a3", true, true), empty, byId("chart-rate")),
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
      if (Number.isInteger(metrics.warmup) && metrics.warmup >= 0) this.warmup = metrics.warmup;
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

    // The samples/s axis from 0 to the steady points' highest (+10%); the legend names a
    // warm-up point clipped above it.
    fitRate() {
      const rate = this.data.rate;
      const cut = rate.length > this.warmup ? this.warmup : 0;
      const high = (values) => values.reduce((m, v) => (v !== null && v > m ? v : m), 0);
      const top = high(rate.slice(cut));
      this.rateTop = top > 0 ? top * 1.1 : 1;
      const clipped = high(rate.slice(0, cut)) > this.rateTop;
      const chart = byId("chart-rate");
      chart.dataset.warmup = clipped ? "clipped" : cut ? "fitted" : "none";
      const label = this.plots[1].root.querySelectorAll(".u-legend .u-series .u-label")[1];
      const text = clipped ? "samples/s (warm-up step clipped)" : "samples/s";
      if (label && label.textContent !== text) label.textContent = text;
    },

    draw() {
      const d = this.data;
      this.plots[0].setData([d.step, d.loss]);
      this.fitRate();
      this.plots[1].setData([d.step, d.rate]);
      this.plots[2].setData([d.step, d.sync]);
      byId("charts").dataset.points = String(d.step.length);
    },
  };
})();
