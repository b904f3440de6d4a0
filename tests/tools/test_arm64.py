"""The ARM64 execution check: its pure parts without qemu, and one real emulated run (slow)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from exporter.artifact.manifest import SCHEMA_VERSION
from tools.arm64 import check as check_module
from tools.arm64 import sysroot as sysroot_module
from tools.arm64.__main__ import main
from tools.arm64.compare import RELATIVE_TOLERANCE, artifact_entry, compare_traces, failures, not_run
from tools.arm64.cpuinfo import CPU_MODELS, cpu_files, proc_cpuinfo, write_cpu_files
from tools.arm64.stubs import NO_DEVICE, UNVERSIONED, read_needs, stub_source, version_script
from tools.arm64.sysroot import Sysroot, package_closure, stamped


def traces(seed: int = 0, prompts: int = 2, steps: int = 4, vocab: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {"seconds": torch.tensor(1.5)}
    for i in range(prompts):
        logits = torch.randn(steps, vocab, generator=g) * 10
        out[f"logits{i}"] = logits
        out[f"tokens{i}"] = logits.argmax(-1)
    return out


# --- comparison -----------------------------------------------------------------------------------


def test_identical_traces_pass_with_zero_difference() -> None:
    x86 = traces()
    c = compare_traces(x86, {k: v.clone() for k, v in x86.items()})
    assert c.passed and c.tokens_equal and c.max_abs_logit_diff == 0.0
    assert c.logit_scale == max(float(x86[f"logits{i}"].abs().max()) for i in range(2))
    assert c.tolerance == pytest.approx(RELATIVE_TOLERANCE * c.logit_scale)


def test_logit_difference_is_measured_and_judged_against_the_scaled_tolerance() -> None:
    x86 = traces()
    scale = compare_traces(x86, x86).logit_scale
    for factor, passes in ((0.5, True), (2.0, False)):
        arm = {k: v.clone() for k, v in x86.items()}
        delta = factor * RELATIVE_TOLERANCE * scale
        arm["logits1"][2, 3] += delta
        c = compare_traces(x86, arm)
        assert c.tokens_equal
        assert c.max_abs_logit_diff == pytest.approx(delta, rel=1e-3)
        assert c.passed is passes


def test_a_different_greedy_token_fails_even_with_close_logits() -> None:
    x86 = traces()
    arm = {k: v.clone() for k, v in x86.items()}
    arm["tokens0"][1] += 1
    c = compare_traces(x86, arm)
    assert not c.tokens_equal and not c.passed


@pytest.mark.parametrize("damage", ["missing_prompt", "wrong_shape"])
def test_a_missing_or_misshapen_trace_fails(damage: str) -> None:
    x86 = traces()
    arm = {k: v.clone() for k, v in x86.items()}
    if damage == "missing_prompt":
        del arm["logits1"], arm["tokens1"]
    else:
        arm["logits1"] = arm["logits1"][:-1]
    assert not compare_traces(x86, arm).passed


def test_report_entry_carries_the_manifest_digest_and_failures_name_the_cpu() -> None:
    x86 = traces()
    bad = {k: v.clone() for k, v in x86.items()}
    bad["tokens0"][0] += 1
    manifest = {
        "model": {"name": "m"},
        "recipe": {"name": "r"},
        "artifact": {"file": "model.pte", "sha256": "ab"},
    }
    by_cpu = {"cortex-a72": compare_traces(x86, x86), "neoverse-n1": compare_traces(x86, bad)}
    entry = artifact_entry("art/m/r", manifest, 0.5, by_cpu)
    assert entry["sha256"] == "ab" and entry["file"] == "model.pte" and entry["passed"] is False
    assert entry["cpus"]["cortex-a72"]["passed"] is True
    json.dumps(entry)  # the report is JSON
    (line,) = failures({"artifacts": [entry]})
    assert "neoverse-n1" in line and "greedy tokens differ" in line


def test_a_program_the_emulated_process_never_traced_fails_with_its_reason_in_strict_json() -> None:
    died = not_run(check_module.guest_failure(-signal.SIGILL, b""))
    entry = artifact_entry(
        "art", {"artifact": {"file": "model.pte", "sha256": "ab"}}, 0.1, {"cortex-a72": died}
    )
    c = entry["cpus"]["cortex-a72"]
    assert c["passed"] is False and c["max_abs_logit_diff"] is None and "SIGILL" in c["error"]
    json.loads(json.dumps(entry, allow_nan=False))
    (line,) = failures({"artifacts": [entry]})
    assert "cortex-a72" in line and "SIGILL" in line


def test_a_guest_that_exits_with_an_error_is_reported_by_its_last_line() -> None:
    message = check_module.guest_failure(1, b"Traceback\n  ...\nImportError: libfoo.so: cannot open\n")
    assert message.endswith("ImportError: libfoo.so: cannot open") and "exited with 1" in message


# --- what the emulated CPU shows ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CPU_MODELS))
def test_midr_and_cpuinfo_carry_the_same_fields(name: str) -> None:
    cpu = CPU_MODELS[name]
    midr = cpu.midr
    assert (midr >> 24, midr >> 20 & 0xF, midr >> 16 & 0xF, midr >> 4 & 0xFFF, midr & 0xF) == (
        cpu.implementer,
        cpu.variant,
        0xF,
        cpu.part,
        cpu.revision,
    )
    text = proc_cpuinfo(cpu, 3)
    assert [int(n) for n in re.findall(r"^processor\t: (\d+)$", text, re.M)] == [0, 1, 2]
    assert set(re.findall(r"^CPU part\t: (0x[0-9a-f]+)$", text, re.M)) == {f"0x{cpu.part:03x}"}
    assert set(re.findall(r"^CPU implementer\t: (0x[0-9a-f]+)$", text, re.M)) == {f"0x{cpu.implementer:02x}"}
    assert "asimd" in text.split("Features\t: ")[1].split("\n")[0].split()


def test_cortex_a72_midr_is_what_linux_reports_on_a_raspberry_pi_4() -> None:
    assert (
        cpu_files(CPU_MODELS["cortex-a72"], 1)["/sys/devices/system/cpu/cpu0/regs/identification/midr_el1"]
        == "0x00000000410fd083\n"
    )


def test_cpu_files_land_inside_the_sysroot(tmp_path: Path) -> None:
    write_cpu_files(tmp_path, CPU_MODELS["neoverse-n1"], 2)
    assert (tmp_path / "sys/devices/system/cpu/possible").read_text() == "0-1\n"
    assert (tmp_path / "sys/devices/system/cpu/cpu1/regs/identification/midr_el1").is_file()
    assert not (tmp_path / "sys/devices/system/cpu/cpu2").exists()
    assert "0xd0c" in (tmp_path / "proc/cpuinfo").read_text()


# --- sysroot helpers ------------------------------------------------------------------------------

READELF = """
Dynamic section at offset 0x1 contains 3 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libcudart.so.13]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [libcusparseLt.so.0]

Version needs section '.gnu.version_r' contains 2 entries:
 Addr: 0x0000000000001000  Offset: 0x001000  Link: 5 (.dynstr)
  000000: Version: 1  File: libcudart.so.13  Cnt: 1
  0x0010:   Name: libcudart.so.13  Flags: none  Version: 14
  0x0020: Version: 1  File: libc.so.6  Cnt: 1
  0x0030:   Name: GLIBC_2.17  Flags: none  Version: 2

Symbol table '.dynsym' contains 5 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
    52: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND cusparseLtMatmulPlanDestroy
    53: 0000000000000000     0 NOTYPE  WEAK   DEFAULT  UND __gmon_start__
   719: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND malloc@GLIBC_2.17 (2)
  3201: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND cudaGetDeviceCount@libcudart.so.13 (14)
  3381: 0000000003161da0   256 FUNC    GLOBAL DEFAULT    8 _ZN2at4cuda3fooEv
"""


def test_needs_versions_and_definitions_are_read_from_readelf() -> None:
    needs, defined = read_needs(READELF)
    assert defined == {"_ZN2at4cuda3fooEv"}
    # strong unversioned references are candidates under every needed library; weak ones never
    loose = {"cusparseLtMatmulPlanDestroy"}
    assert needs == {
        "libcudart.so.13": {"libcudart.so.13": {"cudaGetDeviceCount"}, UNVERSIONED: loose},
        "libc.so.6": {"GLIBC_2.17": {"malloc"}, UNVERSIONED: loose},
        "libcusparseLt.so.0": {UNVERSIONED: loose},
    }


def test_version_scripts_and_stub_sources() -> None:
    assert version_script({"N": {"b", "a"}, UNVERSIONED: {"c"}}) == "N { global: a; b; c; local: *; };\n"
    assert version_script({UNVERSIONED: {"c"}}) == "{ global: c; local: *; };\n"
    assert version_script({}) == "{ local: *; };\n"
    source = stub_source({"cudaGetDeviceCount"})
    assert ".globl cudaGetDeviceCount" in source and f"mov w0, #{NO_DEVICE}" in source


def test_package_closure_drops_virtual_packages_and_dependency_lines() -> None:
    out = "python3.11\n  Depends: libc6\n  Depends: <python3-foo>\nlibc6\n<python3-foo>\n  python3-foo-impl\n"
    assert package_closure(out) == ["libc6", "python3.11"]


def test_a_stamped_step_runs_once(tmp_path: Path) -> None:
    calls: list[int] = []
    assert stamped(tmp_path, "step", lambda: calls.append(1)) is True
    assert stamped(tmp_path, "step", lambda: calls.append(1)) is False
    assert calls == [1]


def test_a_failed_step_leaves_no_stamp(tmp_path: Path) -> None:
    def fail() -> None:
        raise sysroot_module.Arm64SetupError(None, "download failed")

    with pytest.raises(sysroot_module.Arm64SetupError):
        stamped(tmp_path, "step", fail)
    assert not (tmp_path / "stamps" / "step").exists()


def test_the_guest_runs_the_runner_in_the_sysroot_python_on_the_chosen_cpu(tmp_path: Path) -> None:
    s = Sysroot(tmp_path, tmp_path / "sysroot", tmp_path / "site", "/usr/bin/qemu-aarch64-static")
    cmd = check_module.guest_command(s, "neoverse-n1", tmp_path / "job.json")
    assert cmd[:5] == ["/usr/bin/qemu-aarch64-static", "-L", str(tmp_path / "sysroot"), "-cpu", "neoverse-n1"]
    assert cmd[5] == str(s.python) and cmd[-3:] == [
        "-m",
        "tools.arm64.runner",
        str(tmp_path / "job.json"),
    ]
    assert check_module.guest_env(s)["PYTHONPATH"].split(":") == [str(s.site), str(check_module.REPO_ROOT)]


# --- command line ---------------------------------------------------------------------------------


def fake_artifact(folder: Path, suffix: str = ".pte") -> Path:
    folder.mkdir(parents=True)
    (folder / f"model{suffix}").write_bytes(b"x")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "artifact": {"file": f"model{suffix}", "sha256": "00"},
        "recipe": {"name": "r"},
        "model": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "golden.json").write_text(json.dumps({"cases": [{"prompt": [1, 2, 3], "expected": []}]}))
    return folder


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_missing_tools_are_one_line_naming_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sysroot_module.shutil, "which", lambda tool: None)
    art = fake_artifact(tmp_path / "art")
    result = run_cli(str(art), "--out", str(tmp_path / "r.json"), "--root", str(tmp_path / "root"))
    assert result.exit_code == 2
    assert "apt-get install -y" in result.output and "qemu-user-static" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "root").exists()


def test_the_report_is_refused_inside_an_artifact_folder(tmp_path: Path) -> None:
    art = fake_artifact(tmp_path / "art")
    result = run_cli(str(art), "--out", str(art / "report.json"))
    assert result.exit_code == 2 and "sealed" in result.output
    assert not (art / "report.json").exists()


def test_a_non_pte_artifact_is_refused(tmp_path: Path) -> None:
    art = fake_artifact(tmp_path / "art", suffix=".pt2")
    result = run_cli(str(art), "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 2 and ".pte" in result.output


def test_unknown_cpu_models_are_rejected(tmp_path: Path) -> None:
    result = run_cli(str(tmp_path), "--cpu", "pentium")
    assert result.exit_code == 2 and "pentium" in result.output


@pytest.mark.parametrize("passes", [True, False])
def test_the_report_is_written_and_a_failed_comparison_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, passes: bool
) -> None:
    x86 = traces()
    arm = {k: v.clone() for k, v in x86.items()}
    if not passes:
        arm["tokens1"][0] += 1
    entry = artifact_entry(
        "art",
        {"artifact": {"file": "model.pte", "sha256": "ab"}},
        0.1,
        {"cortex-a72": compare_traces(x86, arm)},
    )
    report = {"artifacts": [entry], "passed": entry["passed"]}
    seen: dict[str, Any] = {}

    def fake_check(folders: Any, cpus: Any, steps: int, root: Any, log: Any) -> dict[str, Any]:
        seen.update(cpus=cpus, steps=steps)
        return report

    monkeypatch.setattr(check_module, "check", fake_check)
    out = tmp_path / "deep" / "report.json"
    result = run_cli(str(tmp_path / "art"), "--out", str(out), "--steps", "3")
    assert result.exit_code == (0 if passes else 1)
    assert json.loads(out.read_text()) == report
    assert seen == {"cpus": ("cortex-a72", "neoverse-n1"), "steps": 3}


# --- the real thing -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_built_device_artifact_runs_identically_on_emulated_aarch64(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """Needs qemu-user-static and binutils-aarch64-linux-gnu (see docs/development.md, "ARM64
    execution check"); the sysroot is cached in $EXPORTER_ARM64_ROOT or ~/.cache/exporter/arm64.
    neoverse-n1: the executorch wheel's custom-ops library dies with SIGILL on cortex-a72
    (ARMv8.0), see docs/development.md."""
    from exporter.build.pipeline import build

    untuned = ("quantization.gptq=false",)
    art = build("android-arm64", checkpoint=tiny_checkpoint, out=tmp_path / "art", overrides=untuned)
    report = check_module.check([art], ["neoverse-n1"], steps=4, log=lambda _: None)
    (entry,) = report["artifacts"]
    assert entry["sha256"] == json.loads((art / "manifest.json").read_text())["artifact"]["sha256"]
    result = entry["cpus"]["neoverse-n1"]
    assert result["error"] is None and result["tokens_equal"] and result["passed"], result
    assert 0 <= result["max_abs_logit_diff"] <= result["tolerance"]
    assert report["passed"]
