"""Does DeepSpeed's AutoEP (``expert_parallel``) run on gloo CPU ranks, and does it train the same as without it?

AutoEP (DeepSpeed 0.19.8, ``deepspeed/module_inject/auto_ep*.py``, switched on by the config's
``expert_parallel: {"enabled": true, "autoep_size": N}``) swaps every MoE block of a supported transformers model
(presets: Mixtral, Qwen3-MoE and Qwen2-MoE, Qwen3.5-MoE, DeepSeek-V2/V3, MiniMax-M3) for an ``AutoEPMoELayer`` whose
experts are sharded over the ``N`` ranks of an expert-parallel group, the routed tokens exchanged by
``all_to_all_single``. This script tries it for real: a tiny Qwen2-MoE (hidden 64, 2 MoE layers, 4 experts top-2,
vocab 512, fp32, seq 32) on 2 gloo CPU ranks started by torchrun from this script, ``autoep_size`` 2 at ZeRO-1, 2 and
3, two steps, against the same model and data on 1 rank holding both samples in its micro-batch (and on 2 plain
data-parallel ranks). Recorded per case: whether ``deepspeed.initialize`` and the steps run (else the error and the
DeepSpeed line raising it), the loss of both steps (mean over ranks), ``engine.get_global_grad_norm()`` after each
step, and what each rank holds (expert parameters, local experts per layer, all parameters).

Run: ``python bench/autoep_check.py [--only KEY]``; writes ``bench/results/autoep_check.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
SEQ, SAMPLES, STEPS = 32, 2, 2
# the tests' tiny configs (tests/tiny_configs.py), 2 layers, every layer MoE, an untied head
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_configs import TINY_CONFIGS  # noqa: E402

TWO_MOE_LAYERS = {"num_hidden_layers": 2, "tie_word_embeddings": False}
QWEN2_MOE = {**TINY_CONFIGS["qwen2_moe"], **TWO_MOE_LAYERS, "mlp_only_layers": []}
# AutoEP's DeepSeek presets use the default adapter, which leaves the output-capture registry alone
DEEPSEEK_V2 = {**TINY_CONFIGS["deepseek_v2"], **TWO_MOE_LAYERS, "first_k_dense_replace": 0}
MIXTRAL = {**TINY_CONFIGS["mixtral"], **TWO_MOE_LAYERS, "intermediate_size": 48}
MODELS = {"qwen2_moe": QWEN2_MOE, "deepseek_v2": DEEPSEEK_V2, "mixtral": MIXTRAL}

# world 1 holds both samples in one micro-batch; world 2 gives rank r sample r
# shim: make transformers' output-capture registry take DeepSpeed's calls
# (tuner.measure.rank.layouts.autoep.registry_shim)
CASES: list[dict[str, Any]] = [
    {"key": "ep2/w2/z2/as-installed", "world": 2, "stage": 2, "ep": 2, "shim": False},
    {"key": "ref/w1/z2", "world": 1, "stage": 2, "ep": 0},
    {"key": "ep1/w1/z2", "shim": True, "world": 1, "stage": 2, "ep": 1},
    {"key": "dp/w2/z2", "world": 2, "stage": 2, "ep": 0},
    {"key": "ep2/w2/z1", "shim": True, "world": 2, "stage": 1, "ep": 2},
    {"key": "ep2/w2/z2", "shim": True, "world": 2, "stage": 2, "ep": 2},
    {"key": "ep2/w2/z3", "shim": True, "world": 2, "stage": 3, "ep": 2},
    {"key": "deepseek_v2 ref/w1/z2", "model": "deepseek_v2", "world": 1, "stage": 2, "ep": 0},
    {"key": "deepseek_v2 ep2/w2/z2/as-installed", "model": "deepseek_v2", "world": 2, "stage": 2, "ep": 2},
    {"key": "mixtral ref/w1/z2", "model": "mixtral", "world": 1, "stage": 2, "ep": 0},
    {"key": "mixtral ep2/w2/z2/as-installed", "model": "mixtral", "world": 2, "stage": 2, "ep": 2},
    {"key": "mixtral ep2/w2/z2", "model": "mixtral", "shim": True, "world": 2, "stage": 2, "ep": 2},
]


def ds_config(case: dict[str, Any]) -> dict[str, Any]:
    """fp32, ZeRO ``stage``, plain Adam (no weight decay), AutoEP of degree ``ep`` (0: off)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": SAMPLES // case["world"],
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.0}},
        "zero_optimization": {"stage": case["stage"]},
        "steps_per_print": 10**6,
    }
    if case["ep"]:
        config["expert_parallel"] = {"enabled": True, "autoep_size": case["ep"]}
    return config


def deepspeed_frame(tb: traceback.TracebackException) -> str:
    """The innermost frame of the traceback inside DeepSpeed (file from the package root, line, code)."""
    frames = [f for f in tb.stack if "/deepspeed/" in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f"deepspeed/{frame.filename.split('/deepspeed/', 1)[1]}:{frame.lineno}: {frame.line}"


def rank_main(case: dict[str, Any], out: Path) -> None:
    """One rank of ``case``: build the seeded tiny Qwen2-MoE, initialise, ``STEPS`` steps, write ``rank{r}.json``."""
    import deepspeed
    import torch
    import transformers

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report: dict[str, Any] = {"rank": rank, "phase": "build"}
    if case.get("shim"):
        from tuner.measure.rank.layouts.autoep import registry_shim  # the runner's own shim

        registry_shim()
    try:
        torch.manual_seed(0)
        config = transformers.AutoConfig.for_model(**MODELS[case.get("model", "qwen2_moe")])
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        model.to(torch.float32)
        report["model_elements"] = sum(p.numel() for p in model.parameters())
        report["model_expert_elements"] = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        report["phase"] = "initialize"
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(case))
        report["layer_types"] = sorted({type(m).__name__ for m in engine.module.modules() if "MoE" in type(m).__name__})
        held, experts, shapes, local_experts = 0, 0, {}, []
        for name, p in engine.module.named_parameters():
            size = p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
            held += size
            if ".experts." in name:
                experts += size
                shape = list(getattr(p, "ds_shape", p.shape))
                shapes[name] = shape
                if name.startswith("model.layers.0.") and len(shape) == 3:
                    local_experts.append(shape[0])
        report.update(held_elements=held, held_expert_elements=experts, expert_shapes=shapes)
        report["local_experts_layer0"] = max(local_experts) if local_experts else None
        tokens = torch.randint(0, QWEN2_MOE["vocab_size"], (SAMPLES, SEQ), generator=torch.Generator().manual_seed(0))
        per_rank = SAMPLES // world
        batch = tokens[rank * per_rank : (rank + 1) * per_rank]
        losses, norms = [], []
        for step in range(STEPS):
            report["phase"] = f"step {step}"
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            torch.distributed.all_reduce(mean)
            losses.append(float(mean) / world)
            norm = engine.get_global_grad_norm()
            norms.append(float(norm) if norm is not None else None)
        report.update(phase="done", losses=losses, grad_norms=norms)
    except Exception as error:  # the finding is the error itself
        tb = traceback.TracebackException.from_exception(error)
        report.update(error=f"{type(error).__name__}: {error}", ds_line=deepspeed_frame(tb))
        report["traceback"] = "".join(tb.format())[-4000:]
    (out / f"rank{rank}.json").write_text(json.dumps(report, default=str))


def run_case(case: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Start ``case``'s ranks with torchrun (gloo, one thread each) and collect what each rank wrote."""
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', os.defpath)}"  # the venv's ninja for DeepSpeed's ops
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={case['world']}"]
        command += [__file__, "--rank", json.dumps(case), "--out", scratch]
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            output, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as expired:
            output, rc = f"timed out after {timeout} s: {expired.stdout or ''}", -1
        ranks = []
        for rank in range(case["world"]):
            path = Path(scratch) / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else None)
    ok = rc == 0 and all(r and r.get("phase") == "done" for r in ranks)
    return {
        "status": "ok" if ok else "error",
        "rc": rc,
        "wall_s": time.monotonic() - started,
        "ranks": ranks,
        "output_tail": "" if ok else output[-3000:],
    }


def fmt(value: Any, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: dict[str, Any]) -> list[str]:
    """Markdown rows: one per case, against the 1-rank reference."""
    lines = [
        "| case | status | loss step 0 | loss step 1 | grad norm step 0 | grad norm step 1 | vs ref (loss0, norm0)"
        " | expert elements per rank | local experts (layer 0) | all elements per rank | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, data in results.items():
        model = key.split(" ")[0] if " " in key else "qwen2_moe"
        ref = results.get("ref/w1/z2" if model == "qwen2_moe" else f"{model} ref/w1/z2", {})
        ref_rank = (ref.get("ranks") or [None])[0] or {}
        ranks = [r for r in data["ranks"] if r]
        first = ranks[0] if ranks else {}
        losses, norms = first.get("losses") or [None, None], first.get("grad_norms") or [None, None]
        delta = "-"
        if data["status"] == "ok" and ref_rank.get("losses"):
            dl = losses[0] / ref_rank["losses"][0] - 1
            dn = norms[0] / ref_rank["grad_norms"][0] - 1 if norms[0] and ref_rank["grad_norms"][0] else float("nan")
            delta = f"{dl:+.1e}, {dn:+.1e}"
        status = data["status"] if data["status"] == "ok" else f"error ({first.get('phase', '?')})"
        experts = "/".join(str(r.get("held_expert_elements", "-")) for r in ranks)
        local = "/".join(str(r.get("local_experts_layer0", "-")) for r in ranks)
        held = "/".join(str(r.get("held_elements", "-")) for r in ranks)
        lines.append(
            f"| {label(key)} | {status} | {fmt(losses[0])} | {fmt(losses[1])} | {fmt(norms[0])} | {fmt(norms[1])}"
            f" | {delta} | {experts} | {local} | {held} | {data['wall_s']:.0f} |"
        )
    return lines


def versions() -> str:
    import deepspeed
    import torch
    import transformers

    return f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"


REQUIREMENTS = """\
What AutoEP needs (read from the DeepSpeed 0.19.8 source):

- Switched on by `"expert_parallel": {"enabled": true, "autoep_size": N}` (`deepspeed/runtime/config.py`,
  `parse_autoep_config` in `deepspeed/module_inject/auto_ep_config.py`), applied inside `deepspeed.initialize`
  (`DeepSpeedEngine._configure_expert_parallel`, `deepspeed/runtime/engine.py`). Other keys (defaults):
  `preset_model` (auto from `model_type`), `expert_tensor_parallel_size` 1 (only 1 accepted), `use_grouped_mm` true,
  `disable_triton_grouped_mm` false, `comm_backend` "comm" (or "deepep"), `async_split_plan` false,
  `combine_impl`/`score_apply`/`score_func`/`top_k`/`route_norm` auto (from the preset and model config),
  `load_balance_coeff` must be null, custom-model keys `moe_layer_pattern`, `router_pattern`, `expert_pattern`,
  `expert_w1/w2/w3`, `num_experts_attr`, `top_k_attr`, `has_shared_experts`, `shared_experts_pattern`.
- Presets (`auto_ep_presets/`): `mixtral`, `qwen3_moe` (also `qwen2_moe`), `qwen3_5_moe` (`qwen3_5_moe_text`),
  `deepseek_v2`, `deepseek_v3`, `minimax_m3`; transformers >= 5 (fused 3-D expert weights).
- `autoep_size` must divide every MoE layer's expert count (`validate_autoep_post_detection`) and, with the
  expert-tensor width, tile the world (`build_folding_spec`); the expert-data-parallel group is world / autoep_size.
- ZeRO: no stage is rejected; ZeRO-3 partitions each rank's experts over the expert-data-parallel group
  (`_partition_autoep_zero3_experts`). Offload is rejected only with AutoTP folding (autotp_size > 1).
- CUDA-only parts, none of them defaults: `comm_backend: "deepep"` (DeepEP over NCCL, bf16 only),
  `async_split_plan: true` (`auto_ep_layer.py`: "requires CUDA tensors"), the Triton grouped GEMM (chosen by the
  accelerator, only CUDA sm < 90 prefers it; the CPU accelerator says no). The default path is
  `torch._grouped_mm` (present in torch 2.13's CPU build) and `dist.all_to_all_single` on the expert-parallel
  group, which gloo runs.
"""


def label(key: str) -> str:
    """The case key with its model named (the Qwen2-MoE cases' keys leave it out)."""
    return key if " " in key else f"qwen2_moe {key}"


def finding(results: dict[str, Any]) -> list[str]:
    """The finding, from what ran: the as-installed failures (error and DeepSpeed line), the shimmed and clean runs."""
    lines = [REQUIREMENTS]
    failed = {k: v for k, v in results.items() if v["status"] != "ok"}
    ran = [k for k, v in results.items() if v["status"] == "ok" and "ep2/" in k]
    if ran:
        lines.append(f"AutoEP ran on 2 gloo CPU ranks: {', '.join(f'`{label(k)}`' for k in ran)}.")
    raised = sorted({f"`{r['ds_line']}`" for v in failed.values() for r in v["ranks"] if r and r.get("ds_line")})
    if failed:
        lines.append(f"Failed as installed: {', '.join(f'`{label(k)}`' for k in failed)}, at {'; '.join(raised)}.")
    lines.append("""
The failure is not CPU-specific: transformers 5.24 made `transformers.utils.output_capturing._CAN_RECORD_REGISTRY` a
`dict` subclass whose `get(model)` takes only a model (and whose `__setitem__` keys on `str(model.__class__)`), while
AutoEP's router-logit retargeting (`auto_ep_presets/base.py`, `_install_instance_transformers_output_recorders`,
used by the Mixtral, Qwen3-MoE/Qwen2-MoE adapters, measured here, and by the MiniMax-M3 and Qwen3.5-MoE ones,
read from the source) calls `registry.get(key, default)`.
The failing call runs before any tensor or collective is touched, so CUDA/NCCL ranks
with this transformers fail the same way. DeepSeek presets use the default adapter, which
does not touch the registry, and run as installed. With the bench-side shim (`registry_shim`: accept a string key
and a default) the Qwen2-MoE and Mixtral runs initialise and train.

Numerics: with 2 of 4 experts per rank, every run matches the 1-rank run holding both samples to float32 rounding
(loss and `get_global_grad_norm()` within 1e-7 relative, both steps), at ZeRO-1, 2 and 3; so the tokens routed to the
other rank's experts go through the all-to-all and back (dropping them would change the loss). `autoep_size` 1 on
1 rank (AutoEP's layer, no exchange) equals the transformers block exactly. Each rank holds half the expert
elements; ZeRO-3 splits the dense part over both ranks and keeps each rank's experts whole (the expert-data-parallel
group is 1 rank).

What dstune can do: measure AutoEP on CPU ranks like the other options (the default path has nothing CUDA-only);
search `autoep_size` over the divisors of the expert count that also divide the world, with
`expert_tensor_parallel_size` 1, and offer `comm_backend: "deepep"` and `async_split_plan` on CUDA ranks only. For the
Mixtral, Qwen2/3-MoE, Qwen3.5-MoE and MiniMax-M3 presets under transformers 5.24 (the version installed; the
release that changed the registry was not looked up) with DeepSpeed 0.19.8, either
apply the same registry shim in the rank before `deepspeed.initialize`, or refuse the config with the reason
"AutoEP cannot initialise this model with transformers 5.24: DeepSpeed 0.19.8 calls the output-capture registry as
a dict (auto_ep_presets/base.py:326, TypeError on every device)".
""")
    return lines


def write_report(results: dict[str, Any], path: Path) -> None:
    errors = []
    for key, data in results.items():
        for r in data["ranks"]:
            if r and r.get("error"):
                errors += [
                    f"- `{key}` rank {r['rank']} ({r['phase']}): `{r['error'][:600]}`",
                    f"  raised at `{r.get('ds_line') or 'outside DeepSpeed'}`",
                ]
                break
        else:
            if data["status"] != "ok":
                errors.append(f"- `{label(key)}`: no report, rc {data['rc']}: `{data['output_tail'][-600:]}`")
    lines = [
        "# AutoEP on gloo CPU ranks",
        "",
        f"Measured {datetime.date.today().isoformat()} by `bench/autoep_check.py`: {versions()}, "
        "2 shared CPU cores (niced), one thread per rank.",
        "",
        "Models: tiny Qwen2-MoE (hidden 64, 2 MoE layers, 4 experts top-2, shared expert), DeepSeek-V2 (the "
        "same with MLA and 1 shared expert) and Mixtral (4 experts top-2), built by transformers with vocab 512, fp32, "
        "eager attention, seeded; `as-installed`: no shim, the others with `registry_shim`; "
        f"data: {SAMPLES} seeded samples of {SEQ} tokens, rank r of 2 "
        "takes sample r, a 1-rank run takes both in one micro-batch. Adam lr 1e-3, two steps. Loss: mean over ranks. "
        "Grad norm: `engine.get_global_grad_norm()` after each step. Elements per rank: parameters the rank holds "
        "(ZeRO-3: its partition), experts: those under `.experts.`; local experts: the leading dimension of layer 0's "
        "expert tensors on each rank.",
        "",
        *table(results),
        "",
    ]
    if errors:
        lines += ["Errors:", "", *errors, ""]
    lines += ["## Finding", "", *finding(results), ""]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="run only the cases whose key contains this")
    parser.add_argument("--report", action="store_true", help="only rewrite the report from the saved results")
    args = parser.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank), args.out)
        return
    json_path = RESULTS / "autoep_check.json"
    results = json.loads(json_path.read_text()) if json_path.exists() else {}
    for case in [] if args.report else CASES:
        if args.only and args.only not in case["key"]:
            continue
        results[case["key"]] = run_case(case)
        json_path.write_text(json.dumps(results, indent=1))
        print(case["key"], results[case["key"]]["status"], f"{results[case['key']]['wall_s']:.0f} s", flush=True)
    results = {c["key"]: results[c["key"]] for c in CASES if c["key"] in results}
    print("\n".join(table(results)))
    write_report(results, RESULTS / "autoep_check.md")


if __name__ == "__main__":
    main()
