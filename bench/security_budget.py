"""Expensive answers delivered once and deep configs refused before any build, as rows of ``bench/faults.py``.
Real components: the API app (FastAPI's client in this process, its real estimator and cache), the CLI as a
subprocess. The truths: the HTTP status, headers and body a client sees; the computations counted in the route's
own function; the wall time each one took, measured around that function; the CLI's exit code and stderr."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from security import AUTH, DSTUNE, LONG, _client, _outcome

TINY_LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000}  # fmt: skip
TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 4, "vocab_size": 512, "num_local_experts": 8, "num_experts_per_tok": 2,
                "num_hidden_layers": 512}  # fmt: skip
DEEP = [TINY_MIXTRAL, {"model_type": "bart", "encoder_layers": 300, "decoder_layers": 300, "d_model": 64},
        {"model_type": "llava", "text_config": {"num_hidden_layers": 200}, "vision_config": {"depth": 100}},
        {"model_type": "t5", "num_layers": 200, "num_decoder_layers": 200}]  # fmt: skip


class _Timed:
    """Wraps a route's function: counts its calls and keeps how long each took."""

    def __init__(self, module: Any, name: str) -> None:
        self.module, self.name, self.real = module, name, getattr(module, name)
        self.took: list[float] = []
        self.running = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        self.running.set()
        try:
            return self.real(*args, **kwargs)
        finally:
            self.took.append(time.monotonic() - started)

    def __enter__(self) -> _Timed:
        setattr(self.module, self.name, self)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.module, self.name, self.real)


def canonical_key() -> Any:
    """One seq_len max question sent in two key orders (one computation), and pinned at a default (another)."""
    from tuner.api.routes import estimate as route

    with _Timed(route, "longest") as timed, _client(request_budget_s=600) as client:
        inline = {key: value for key, value in LONG.items() if key != "model"}
        body = {"workload": {"config": TINY_LLAMA, **inline, "gpus": 8}}
        reordered = {"workload": {**inline, "gpus": 8, "config": dict(reversed(list(TINY_LLAMA.items())))}}
        same = client.post("/v1/estimate", json=body).json() == client.post("/v1/estimate", json=reordered).json()
        once = len(timed.took)
        pinned = client.post("/v1/estimate", json={**body, "offload_optimizer": "none"})
    apart = pinned.status_code == 200 and len(timed.took) == 2
    return _outcome(
        recovered=same and once == 1 and apart,
        note=f"reordered: {once} computation(s), same answer {same}; pinned at its default: computed apart {apart}",
    )


def retry_after_estimate() -> Any:
    """Three seq_len max answers computed past a 0.05 s budget, then a fourth: its 503's Retry-After against the
    durations the route's function measured (the first, before any is known, says the 5 s default)."""
    from tuner.api.routes import estimate as route

    said: list[int] = []
    with _Timed(route, "longest") as timed, _client(request_budget_s=0.05) as client:
        for gpus in (8, 4, 2, 1):
            body = {"workload": {**LONG, "gpus": gpus}}
            late = client.post("/v1/estimate", json=body)
            said.append(int(late.headers.get("Retry-After", -1)))
            while client.post("/v1/estimate", json=body).status_code != 200:
                time.sleep(0.05)
    took = [round(seconds, 2) for seconds in timed.took]
    ok = said[0] == 5 and all(1 <= value <= 2 + max(took) for value in said[1:])
    return _outcome(recovered=ok, note=f"Retry-After {said} s; the computations took {took} s")


def token_beside_a_flood() -> Any:
    """One address holds its slot with a seq_len max answer in progress; the same address's next one is refused
    unstarted, and a request with the server's token from that address starts (its own slot)."""
    from tuner.api.routes import recommend as route

    with _Timed(route, "recommend_longest") as timed, _client(request_budget_s=0.01) as client:
        flood = [client.post("/v1/recommend", json={"workload": {**LONG, "gpus": 8, "nodes": n}}) for n in (1, 2)]
        refused = "this client" in flood[1].text
        token = client.post("/v1/recommend", json={"workload": {**LONG, "gpus": 4}}, headers=AUTH)
        started = token.status_code == 200 or "budget" in token.text
    return _outcome(
        recovered=refused and started,
        note=f"address's second: refused {refused}; token's: {token.status_code}, started {started}; "
        f"{len(timed.took)} computation(s) ended",
    )


def deep_configs() -> Any:
    """Configs whose layer counts are each within bounds but too many in all: 422 naming one at once (API), exit 2
    in one line (CLI, a tiny Mixtral of 512 layers)."""
    slowest, good = 0.0, 0
    with _client() as client:
        for config in DEEP:
            started = time.monotonic()
            answer = client.post("/v1/estimate", json={"workload": {"config": config, "seq_len": "max"}})
            slowest = max(slowest, time.monotonic() - started)
            good += answer.status_code == 422 and "layers in all" in answer.text
    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(TINY_MIXTRAL))
    started = time.monotonic()
    done = subprocess.run([DSTUNE, "estimate", "--model", str(path), "--gpus", "1", "--seq-len", "128"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    cli_s = time.monotonic() - started
    one_line = done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "layers in all" in done.stderr
    return _outcome(
        recovered=good == len(DEEP) and one_line,
        recover_s=max(slowest, cli_s),
        note=f"API {good}/{len(DEEP)} 422, slowest {slowest:.2f} s; CLI exit {done.returncode} in {cli_s:.1f} s",
    )


def rows() -> list[tuple[str, str, bool, Any]]:
    """(name, criterion, needs DeepSpeed, injection) for bench/faults.py's matrix."""
    return [
        ("seq_len max: key order, pinned default (API)", "one computation; a pin another", False, canonical_key),
        ("seq_len max: Retry-After (API)", "from measured durations", False, retry_after_estimate),
        ("seq_len max: token beside an address (API)", "token starts, address refused", False, token_beside_a_flood),
        ("layers in all (API, CLI)", "422 / exit 2 naming one, no build", False, deep_configs),
    ]


__all__ = ["rows"]
