"""One numeric path on every CPU (issue 43, item 6): fp32 unless POPRI_CPU_BF16=1, whatever the
CPU computes natively; the precision in results.json, the table's header and the stage keys.

    python -m pytest -q tests/test_numeric_path.py

Before: bf16 where the CPU had AVX512-BF16 / AMX, fp32 elsewhere, and the main job's verdict
flipped between two machines on the same commit and seed.
"""

from __future__ import annotations

import pytest

from popri.specs.commands.embed import EmbedCall
from popri.kit import Stage
from popri.models import llm
from popri.pipeline import stages as S
from popri.pipeline.driver import results_table, run_precision


@pytest.mark.parametrize("native", [True, False])
def test_a_cpu_computes_in_fp32_unless_bf16_is_opted_in(monkeypatch, native):
    monkeypatch.setattr(llm, "bf16_native", lambda device: native)
    monkeypatch.delenv(llm.CPU_BF16_ENV, raising=False)
    assert llm.use_bf16(True, "cpu") is False and llm.precision("cpu") == "fp32"
    monkeypatch.setenv(llm.CPU_BF16_ENV, "1")
    assert llm.use_bf16(True, "cpu") is native
    assert llm.precision("cpu") == ("bf16" if native else "fp32")
    assert llm.use_bf16(False, "cpu") is False  # a stage's bf16 off stays off
    monkeypatch.setenv(llm.CPU_BF16_ENV, "0")
    assert llm.use_bf16(True, "cpu") is False


def test_a_gpu_keeps_bf16_where_it_computes_it(monkeypatch):
    monkeypatch.setattr(llm, "bf16_native", lambda device: device.startswith("cuda"))
    monkeypatch.delenv(llm.CPU_BF16_ENV, raising=False)
    assert llm.use_bf16(True, "cuda") is True and llm.precision("cuda") == "bf16"
    assert llm.use_bf16(False, "cuda") is False


def test_this_machine_records_its_own_path():
    """No monkeypatch: a CUDA device with bf16 records 'cuda bf16', any CPU 'cpu fp32' by default
    (run on a GPU by benchmarks/gpu_check.sh)."""
    import os

    import torch

    if torch.cuda.is_available():
        want = "cuda bf16" if torch.cuda.is_bf16_supported() else "cuda fp32"
    elif os.environ.get(llm.CPU_BF16_ENV) == "1":
        want = f"cpu {'bf16' if llm.bf16_native('cpu') else 'fp32'}"
    else:
        want = "cpu fp32"
    assert run_precision() == want


def test_autocast_is_a_no_op_on_a_default_cpu(monkeypatch):
    import contextlib

    monkeypatch.setattr(llm, "bf16_native", lambda device: True)
    monkeypatch.delenv(llm.CPU_BF16_ENV, raising=False)
    assert isinstance(llm.autocast("cpu"), contextlib.nullcontext)


def test_the_precision_is_in_results_and_the_table_header(monkeypatch):
    monkeypatch.setattr(llm, "default_device", lambda: "cpu")
    monkeypatch.setattr(llm, "bf16_native", lambda device: True)
    monkeypatch.delenv(llm.CPU_BF16_ENV, raising=False)
    assert run_precision() == "cpu fp32"
    monkeypatch.setenv(llm.CPU_BF16_ENV, "1")
    assert run_precision() == "cpu bf16"
    r = {"method": "popri", "run_dir": "runs/x", "rounds": 1, "prompts": 2,
         "samples_per_prompt": 2, "num_synthetic": 4, "generator": "g", "downstream": "d",
         "precision": "cpu fp32", "epsilon": 1.0, "delta": 3e-6, "methods": {},
         "noise_multiplier": 1.0, "sample_rate": 0.5, "accountant": "rdp"}
    assert results_table(r).splitlines()[0].endswith(", precision cpu fp32")


def test_opting_in_to_cpu_bf16_is_in_every_stage_key(tmp_path, monkeypatch):
    """POPRI_CPU_BF16 changes more than the last bits: a stage computed in bf16 is not reused by
    a default (fp32) run, and a run without it keeps the keys it had before (resume)."""
    st = Stage("s", EmbedCall(input="x", out=str(tmp_path / "o.npy")), outputs=[])
    keys = {}
    for v in (None, "1"):
        if v is None:
            monkeypatch.delenv("POPRI_CPU_BF16", raising=False)
        else:
            monkeypatch.setenv("POPRI_CPU_BF16", v)
        runner = S.StageRunner(tmp_path / f"run{v}")
        keys[v] = runner.key(st)
        assert runner.env.get("POPRI_CPU_BF16") == v  # passed on to the stage
    assert keys[None] != keys["1"]
    monkeypatch.delenv("POPRI_CPU_BF16", raising=False)
    from popri.pipeline import keys as K

    monkeypatch.setattr(K, "KEYED_ENV", ())  # the keys' module (pipeline/keys.py)
    assert S.StageRunner(tmp_path / "old").key(st) == keys[None]  # unchanged when unset


def test_cpu_bf16_needs_the_instructions_not_onednns_flag(monkeypatch):
    """oneDNN says it supports bf16 on AVX512F alone, where it only converts (the main job took
    2.0x its fp32 time so on this project's box): native means AVX512-BF16 or AMX."""
    import torch

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True,
                        raising=False)
    for avx, amx, want in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda a=avx: a,
                            raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda a=amx: a, raising=False)
        assert llm.bf16_native("cpu") is want
    # opted in on a CPU without them: fp32, and the results say so
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(llm, "default_device", lambda: "cpu")
    monkeypatch.setenv(llm.CPU_BF16_ENV, "1")
    assert llm.use_bf16(True, "cpu") is False and run_precision() == "cpu fp32"
