"""What an ARM CPU model shows to cpuinfo (and so to XNNPACK's kernel choice) under qemu-user.

qemu-user passes the x86 host's ``/proc/cpuinfo`` and ``/sys`` through; ``-L SYSROOT`` serves files
from the sysroot first, so we write an ARM view there before each run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuModel:
    qemu_name: str  # qemu's -cpu name
    implementer: int
    variant: int
    part: int
    revision: int
    features: tuple[str, ...]  # /proc/cpuinfo "Features" (Linux hwcap names)

    @property
    def midr(self) -> int:
        """MIDR_EL1: implementer[31:24] variant[23:20] architecture[19:16]=0xf part[15:4] revision[3:0]."""
        return self.implementer << 24 | self.variant << 20 | 0xF << 16 | self.part << 4 | self.revision


_BASE = ("fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32")
# Arm's technical reference manuals: Cortex-A72 r0p3 (part 0xd08), Neoverse N1 r3p1 (part 0xd0c).
CPU_MODELS = {
    "cortex-a72": CpuModel("cortex-a72", 0x41, 0x0, 0xD08, 0x3, (*_BASE, "cpuid")),
    "neoverse-n1": CpuModel(
        "neoverse-n1",
        0x41,
        0x3,
        0xD0C,
        0x1,
        (*_BASE, "atomics", "fphp", "asimdhp", "cpuid", "asimdrdm", "lrcpc", "dcpop", "asimddp", "ssbs"),
    ),
}


def proc_cpuinfo(cpu: CpuModel, n_cpus: int) -> str:
    """The text Linux on arm64 gives in /proc/cpuinfo (one block per processor)."""
    block = (
        "processor\t: {i}\n"
        "BogoMIPS\t: 50.00\n"
        f"Features\t: {' '.join(cpu.features)}\n"
        f"CPU implementer\t: 0x{cpu.implementer:02x}\n"
        "CPU architecture: 8\n"
        f"CPU variant\t: 0x{cpu.variant:x}\n"
        f"CPU part\t: 0x{cpu.part:03x}\n"
        f"CPU revision\t: {cpu.revision}\n\n"
    )
    return "".join(block.format(i=i) for i in range(n_cpus))


def cpu_files(cpu: CpuModel, n_cpus: int) -> dict[str, str]:
    """Every file cpuinfo reads, path (absolute, as the guest sees it) -> text."""
    span = "0" if n_cpus == 1 else f"0-{n_cpus - 1}"
    files = {"/proc/cpuinfo": proc_cpuinfo(cpu, n_cpus)}
    for name in ("possible", "present", "online"):
        files[f"/sys/devices/system/cpu/{name}"] = span + "\n"
    for i in range(n_cpus):
        files[f"/sys/devices/system/cpu/cpu{i}/regs/identification/midr_el1"] = f"0x{cpu.midr:016x}\n"
    return files


def write_cpu_files(sysroot: Path, cpu: CpuModel, n_cpus: int) -> None:
    for guest_path, text in cpu_files(cpu, n_cpus).items():
        path = sysroot / guest_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
