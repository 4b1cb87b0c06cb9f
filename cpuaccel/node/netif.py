"""A node's IPv4 interfaces and routes, as its kernel knows them: part of the fact probe
and of every rank's start (``cpuaccel.worker``), so stdlib only and cheap.

The addresses come from the kernel's netlink answer (``RTM_GETADDR``, what ``ip -4
addr`` prints): every address of every interface with its prefix length, secondary ones
included, which the older ioctl (one address an interface) misses. The route to a
given address is the kernel's own choice: a UDP socket connected to it (no packet is
sent) reports the source address the kernel would use, as ``ip route get`` does.
"""

from __future__ import annotations

import _socket as socket
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NETLINK_ROUTE = 0
_RTM_GETADDR = 22
_RTM_NEWADDR = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8
_DEADLINE = 2.0  # seconds for the kernel's answer: it is immediate, but never wait for good


def _align(n: int) -> int:
    return (n + 3) & ~3


def addresses() -> list[tuple[int, str, int]]:
    """(interface index, IPv4 address, prefix length) of every address, from netlink;
    [] where netlink cannot be read."""
    found: list[tuple[int, str, int]] = []
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE)
    except (AttributeError, OSError):
        return found
    try:
        sock.settimeout(_DEADLINE)
        sock.bind((0, 0))
        # nlmsghdr (len, type, flags, seq, pid) + ifaddrmsg (family, prefixlen, flags,
        # scope, index)
        body = struct.pack("BBBBI", socket.AF_INET, 0, 0, 0, 0)
        header = struct.pack(
            "=IHHII", 16 + len(body), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
        )
        sock.send(header + body)
        done = False
        while not done:
            data = sock.recv(65536)
            if not data:
                break
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    done = True
                    break
                if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                    done = True
                    break
                if kind == _RTM_NEWADDR:
                    found.extend(_address_of(data[offset + 16 : offset + length]))
                offset += _align(length)
    except OSError:
        pass
    finally:
        sock.close()
    return found


def _address_of(message: bytes) -> list[tuple[int, str, int]]:
    if len(message) < 8:
        return []
    family, prefix, _, _, index = struct.unpack_from("BBBBI", message, 0)
    if family != socket.AF_INET:
        return []
    attrs: dict[int, bytes] = {}
    offset = 8
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            break
        attrs[kind] = message[offset + 4 : offset + length]
        offset += _align(length)
    raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    if raw is None or len(raw) != 4:
        return []
    return [(index, socket.inet_ntoa(raw), prefix)]


def _sys(name: str, what: str) -> str:
    try:
        with open(f"/sys/class/net/{name}/{what}") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def _number(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


def interfaces() -> list[dict[str, Any]]:
    """Every interface with its IPv4 addresses: name, addresses ([address, prefix]
    pairs), mtu, up (administratively, and with a carrier where the kernel says),
    loopback, speed (Mbit/s; None where the kernel does not know it, as for veth)."""
    names = {}
    try:
        names = dict(socket.if_nameindex())
    except OSError:
        pass
    by_index: dict[int, list[list[Any]]] = {}
    for index, address, prefix in addresses():
        by_index.setdefault(index, []).append([address, prefix])
    found = []
    for index, name in sorted(names.items()):
        flags = _number(_sys(name, "flags")) or 0
        speed = _number(_sys(name, "speed"))
        found.append(
            {
                "name": name,
                "addresses": by_index.get(index, []),
                "mtu": _number(_sys(name, "mtu")),
                "up": bool(flags & _IFF_UP) and _sys(name, "operstate") != "down",
                "loopback": bool(flags & _IFF_LOOPBACK),
                "speed": speed if speed is not None and speed > 0 else None,
            }
        )
    return found


def source_address(target: str) -> str | None:
    """The source address the kernel picks to reach ``target`` (no packet sent), or None
    where it has no route."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect((target, 9))
        return str(sock.getsockname()[0])
    except OSError:
        return None
    finally:
        sock.close()


def interface_of(address: str, found: list[dict[str, Any]] | None = None) -> str | None:
    """The name of the interface that holds ``address``."""
    for entry in interfaces() if found is None else found:
        if any(a == address for a, _ in entry["addresses"]):
            return str(entry["name"])
    return None


def routes() -> list[dict[str, Any]]:
    """The main routing table (``/proc/net/route``): each route's interface, destination,
    prefix length, gateway and metric, as ``ip -4 route`` lists them."""
    found: list[dict[str, Any]] = []
    try:
        with open("/proc/net/route") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        words = line.split()
        if len(words) < 8:
            continue
        try:
            dest, gateway, flags, metric, mask = (
                int(w, 16) for w in (words[1], words[2], words[3], words[6], words[7])
            )
        except ValueError:
            continue
        if not flags & 0x1:  # RTF_UP
            continue
        found.append(
            {
                # None: a route that rejects (unreachable, prohibit, blackhole: "*")
                "interface": None if flags & 0x200 or words[0] == "*" else words[0],
                "destination": socket.inet_ntoa(struct.pack("<I", dest)),
                "prefix": bin(mask).count("1"),
                "gateway": socket.inet_ntoa(struct.pack("<I", gateway)) if gateway else None,
                "metric": metric,
            }
        )
    return found


def ssh_address() -> str | None:
    """The address this node was reached at by the ssh session running us (sshd's
    SSH_CONNECTION: client address, client port, server address, server port)."""
    words = os.environ.get("SSH_CONNECTION", "").split()
    return words[2] if len(words) == 4 else None
