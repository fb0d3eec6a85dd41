"""The worker's seccomp filter: system calls a kernel solution has no use for, refused by the kernel.

Installed by the launcher (:func:`dsa_bench.run.sandbox.restrict_self`) after no-new-privileges and
before the worker starts, so the worker and everything it starts inherit it. Unlike the audit hook it
also holds against code that calls the C library directly (``ctypes``), and unlike Landlock it does
not stop the NVIDIA driver from starting, so it stands on CUDA devices too. Refused, with an error
(never a kill, so a library that probes a call sees an ordinary failure):

- sockets of any family but ``AF_UNIX`` (``EACCES``): no network, no netlink, no raw packets;
- another process's memory or execution: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``;
- the machine's and the namespaces' state: ``mount``, ``umount2``, ``pivot_root``, ``unshare``,
  ``setns``, ``reboot``, kernel modules, ``kexec_*``, ``bpf``, the kernel keyrings,
  ``open_by_handle_at``, ``userfaultfd``, ``io_uring_setup`` (its requests bypass this filter);
- the system calls of another ABI (x86's 32-bit and x32 entry points) (``EPERM``).

The filter is a classic BPF program over ``struct seccomp_data`` (``nr`` at 0, ``arch`` at 4, the
arguments from 16), built here from the tables below: only x86_64 and aarch64, where the numbers are
known; elsewhere nothing is installed and the walls say so.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # the first argument's low 32 bits (little-endian)
_AF_UNIX = 1
_X32_SYSCALL_BIT = 0x40000000

#: (audit arch, socket's number, the refused calls' numbers) per machine; from the kernel's syscall tables
_TABLES: dict[str, tuple[int, int, dict[str, int]]] = {
    "x86_64": (0xC000003E, 41, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "mount": 165, "umount2": 166,
        "pivot_root": 155, "unshare": 272, "setns": 308, "reboot": 169, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "bpf": 321, "add_key": 248, "request_key": 249,
        "keyctl": 250, "open_by_handle_at": 304, "userfaultfd": 323, "io_uring_setup": 425,
    }),
    "aarch64": (0xC00000B7, 198, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "mount": 40, "umount2": 39,
        "pivot_root": 41, "unshare": 97, "setns": 268, "reboot": 142, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "bpf": 280, "add_key": 217, "request_key": 218,
        "keyctl": 219, "open_by_handle_at": 265, "userfaultfd": 282, "io_uring_setup": 425,
    }),
}  # fmt: skip
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

#: what the walls say when the filter is in force
PROTECTION = "seccomp: no sockets but UNIX ones, no ptrace or other processes' memory, no mounts, namespaces, modules or bpf"


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def refused_calls(machine: str | None = None) -> dict[str, int]:
    """The refused system calls' numbers on ``machine`` (this one by default); empty where unknown."""
    table = _TABLES.get(_MACHINES.get(machine or platform.machine(), ""))
    return dict(table[2]) if table else {}


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` ("x86_64" or "aarch64") as (code, jt, jf, k) instructions."""
    arch, socket_nr, refused = _TABLES[machine]
    allow, deny, deny_socket = "allow", "deny", "deny_socket"
    body: list[tuple[int, object, object, int]] = [  # jt / jf: 0, or a label resolved below
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_BPF_JEQ_K, 0, deny, arch),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    if machine == "x86_64":
        body.append((_BPF_JGE_K, deny, 0, _X32_SYSCALL_BIT))
    body += [(_BPF_JEQ_K, deny, 0, nr) for nr in refused.values()]
    body += [
        (_BPF_JEQ_K, 0, allow, socket_nr),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0),
        (_BPF_JEQ_K, allow, deny_socket, _AF_UNIX),
    ]
    labels = {allow: len(body), deny: len(body) + 1, deny_socket: len(body) + 2}
    body += [(_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EACCES)]

    def offset(at: int, target: object) -> int:
        if target == 0:
            return 0
        jump = labels[str(target)] - at - 1
        assert 0 <= jump < 256, "a classic BPF jump is one byte"
        return jump

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(body)]


def install() -> str:
    """Install the filter on this process (no-new-privileges must be set); what is in force, in words."""
    machine = _MACHINES.get(platform.machine())
    if sys.platform != "linux" or machine is None:
        return f"no seccomp filter: no system call table for {sys.platform}/{platform.machine()}"
    instructions = program(machine)
    array = (_Instruction * len(instructions))(*(_Instruction(*i) for i in instructions))
    prog = _Program(len(instructions), ctypes.cast(array, ctypes.POINTER(_Instruction)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return f"no seccomp filter: the kernel refused it ({errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())})"
    return PROTECTION
