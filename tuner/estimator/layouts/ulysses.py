"""Ulysses sequence parallelism and ALST's pieces in the activation terms of one rank.

With Ulysses (``sequence_parallel_size`` = sp) a rank holds ``s/sp`` tokens of every sample: its embeddings, norms,
MLP, LM head and loss see ``s/sp`` tokens, so what they save for backward is the model's at ``s/sp``
(:func:`local_seq`). Attention runs over the FULL sequence for the heads a rank owns after the all-to-all
(``h/sp`` query heads, ``kv/sp`` key-value heads): what SDPA saves (query, key, value, output, fp32 log-sum-exp) is
``s × h/sp`` elements per tensor, the same bytes as ``s/sp × h``, so the trace at ``s/sp`` counts it, except when
there are fewer key-value heads than sp: Ulysses then repeats each ``sp/kv`` times and a rank keeps one whole
key-value head over ``s`` (:func:`kv_replication_bytes`), and except the output projection's input, a storage of its
own under Ulysses (:func:`attention_output_bytes`). Inside each layer's forward and backward the all-to-all's
input and output buffers live for a moment (:func:`all_to_all_buffers`, a transient of the phase).

ALST (:class:`tuner.workload.LongContext`):

* ``tiled_mlp_shards`` = k: DeepSpeed's ``TiledMLP`` computes each MLP block shard by shard without grad and saves
  only its input, recomputing one shard at a time in backward: the MLP's intermediates (traced,
  :mod:`tuner.profile.working_sets`, else :func:`mlp_saved_bytes`) leave the saved activations; backward holds one
  shard's worth again.
* ``tiled_loss_shards`` = k: ``TiledFusedLogitsLoss`` computes logits, loss and their backward shard by shard inside
  forward and saves only the gradient of its input: the fp32 log-softmax of the logits (``4·b·s·V``) leaves the
  saved activations, the gradient ``e·b·s·h`` joins them, and the logits workspace is one shard's at its worst
  moment (three fp32 shard tensors in its backward, :mod:`.tiled_loss`).
* With checkpointing, the recomputed layer holds its saved tensors and then, part-way through its backward, its
  worst moment (:mod:`tuner.profile.working_sets`, traced): under a tiled MLP the one outside the MLP (RMSNorm's
  fp32 gradient temporaries beside attention's saved tensors), else the larger of that and the MLP's own.
* ``offload_checkpoints`` (with checkpointing): the checkpointed layer inputs live in host memory (pinned on CUDA
  hosts), only the layers in flight on the device: the one recomputed in backward and the next one's input being
  copied back.

Pure arithmetic over the model's shapes; measured against the true peak of real DeepSpeed runs with Ulysses on gloo
CPU ranks (``bench/sp_true_peak.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimator.activations.saved import LayerActivations
from tuner.estimator.layouts.base import LayoutTerms
from tuner.estimator.settings import FP32, Settings
from tuner.estimator.terms import Contribution, Entry, detail
from tuner.estimator.tiled_loss import shard_workspace
from tuner.workload import ModelSpec, Ranks, Workload, kv_replication
from tuner.workload.layouts import ULYSSES as ULYSSES_KIND

IN_FLIGHT_CHECKPOINTS = 2  # offloaded checkpoints on the device at once: the layer recomputed and the next fetched


def local_seq(workload: Workload, s: Settings) -> int:
    """Tokens of each sample a rank holds: ``s / sp``."""
    return workload.train.seq_len // max(1, s.layout.sequence_parallel)


def _moe_fields(model: ModelSpec) -> dict[str, int]:
    """The MoE shapes of a transformers config (experts per token, expert and shared-expert widths); empty if
    dense."""
    config, experts = model.text_config, model.routed_experts
    top_k = config.get("num_experts_per_tok") or 0
    if not experts or not top_k:
        return {}
    width = config.get("moe_intermediate_size") or config.get("intermediate_size") or 0
    shared = config.get("shared_expert_intermediate_size") or 0
    return {"experts": int(experts), "top_k": int(top_k), "width": int(width), "shared": int(shared)}


def mlp_saved_bytes(model: ModelSpec, tokens: int, elem: int) -> int:
    """Bytes one MLP block saves for backward beyond its input, over ``tokens`` tokens (what ``TiledMLP`` drops).

    Gated (SwiGLU): the gate's output, its activation, the up projection and their product (``4·e·t·f``); GELU:
    the first projection and its activation (``2·e·t·f``). MoE: each token's copy for each of its ``top_k`` experts
    (``e·t·k·h``) and their gated intermediates (``4·e·t·k·f_e``), the router's fp32 logits and probabilities
    (``8·t·E``), and a shared expert's intermediates when the model has one.
    """
    moe = _moe_fields(model)
    per_token = (4 if model.gated_mlp else 2) * elem
    if not moe:
        return per_token * tokens * model.intermediate_size
    routed = tokens * moe["top_k"]
    saved = elem * routed * model.hidden_size + per_token * routed * moe["width"] + 2 * FP32 * tokens * moe["experts"]
    if moe["shared"]:
        saved += per_token * tokens * moe["shared"] + elem * tokens  # its intermediates and sigmoid gate
    return saved


def kv_replication_bytes(model: ModelSpec, batch: int, seq: int, elem: int, sp: int) -> int:
    """Extra bytes one layer's attention saves when Ulysses replicates key-value heads (sp > kv heads): a whole key
    and value head over the full sequence instead of ``kv/sp`` of one."""
    kv = model.num_kv_heads or model.num_heads
    if kv_replication(kv, sp) == 1:
        return 0
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    return 2 * elem * batch * seq * head_dim * (sp - kv) // sp


def attention_output_bytes(model: ModelSpec, batch: int, local: int, elem: int) -> int:
    """What one layer saves under Ulysses beyond the model's own trace: the attention output gathered back by the
    all-to-all, ``e·b·(s/sp)·q·d``, which the output projection saves as its input. In the plain model that input
    is the attention kernel's own output (its ``[b, s, heads, d]`` layout makes the transpose a view), which the
    kernel saves too: one storage. Under Ulysses they are two (measured: ``bench/sp_true_peak.py``, storages alive
    after the forward pass by the op that made them, with and without Ulysses at the same tokens per rank)."""
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    return elem * batch * local * model.num_heads * head_dim


def all_to_all_buffers(model: ModelSpec, batch: int, local: int, elem: int, sp: int) -> int:
    """One layer's all-to-all buffers at their worst moment: query, key and value (key-value heads replicated to sp
    when fewer) packed for the exchange and received, ``2·e·b·(s/sp)·d·(q + 2·kv)``."""
    kv = max(model.num_kv_heads or model.num_heads, sp if kv_replication(model.num_kv_heads, sp) > 1 else 0)
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    return 2 * elem * batch * local * head_dim * (model.num_heads + 2 * kv)


def all_to_all_bytes(model: ModelSpec, batch: int, local: int, elem: int, sp: int) -> int:
    """Bytes one rank's all-to-alls move in one layer's forward: query, key, value in and the output back,
    ``(s/sp)·d·(2·q + 2·kv)·e`` (key-value heads replicated to sp when fewer); backward moves as much again."""
    kv = model.num_kv_heads or model.num_heads
    kv = sp if kv_replication(kv, sp) > 1 else kv
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    return elem * batch * local * head_dim * (2 * model.num_heads + 2 * kv)


def mlp_params(model: ModelSpec) -> int:
    """Weights one token's MLP pass multiplies through, over all layers (what ``TiledMLP`` recomputes in backward):
    ``3·h·f`` (gated) or ``2·h·f`` per layer; an MoE's ``top_k`` experts and shared expert."""
    per = 3 if model.gated_mlp else 2
    moe = _moe_fields(model)
    width = moe["top_k"] * moe["width"] + moe["shared"] if moe else model.intermediate_size
    return model.num_layers * per * model.hidden_size * width


@dataclass
class Activations:
    """One rank's activation terms: saved after forward, the logits workspace, and what backward adds (the recomputed
    block, a tiled MLP's shard); ``host``: checkpoints offloaded to host memory; ``transient``: the all-to-all's
    buffers inside a layer."""

    saved: int
    workspace: int
    recompute: int
    host: int = 0
    host_count: int = 0  # how many host tensors ``host`` is (one checkpoint per layer), each pinned on CUDA
    transient: int = 0
    peak: int = 0  # with checkpointing, the recomputed layer's worst moment in its backward (traced; 0: unknown)
    peak_outside_mlp: int = 0  # the same outside its MLP's backward, the MLP's tensors left out
    recompute_saved: int = 0  # with checkpointing, the recomputed layer's saved tensors alone (before its worst moment)
    outside: int = 0  # of ``saved``, what the model saves outside its layers (embeddings, final norm, head, loss)
    mlp_saved: int = 0  # what one layer's MLP block saves, traced (0: unknown, :func:`mlp_saved_bytes` then)

    @classmethod
    def of(cls, traced: LayerActivations, workspace: int) -> Activations:
        """The model's terms (traced or by formula) with its logits ``workspace``, before Ulysses and ALST."""
        return cls(
            traced.saved, workspace, traced.recompute, peak=traced.peak, peak_outside_mlp=traced.peak_outside_mlp,
            outside=traced.outside, mlp_saved=traced.mlp_saved,
        )  # fmt: skip


def long_context_terms(
    workload: Workload, s: Settings, traced: LayerActivations, workspace: int
) -> tuple[Activations, Contribution]:
    """The model's terms at ``s/sp`` tokens (``traced``, with its logits ``workspace``) with Ulysses' and ALST's terms
    (module docstring) applied, and the details they record."""
    acts = Activations.of(traced, workspace)  # the rank's own, built here
    out: list[Entry] = []
    model, elem, batch = workload.model, s.param_bytes, s.micro_batch
    sp, local, layers = s.layout.sequence_parallel, local_seq(workload, s), max(1, model.num_layers)
    tokens = batch * local
    replicated = 0
    if sp > 1:
        replicated = kv_replication_bytes(model, batch, workload.train.seq_len, elem, sp)
        output = attention_output_bytes(model, batch, local, elem)
        out += detail("ulysses_attention_output", output)
        if s.activation_checkpointing:  # the recomputed layer's saved tensors
            acts.recompute += replicated + output
        else:
            acts.saved += layers * (replicated + output)
        acts.transient = all_to_all_buffers(model, batch, local, elem, sp)
        out += detail("all_to_all_buffers", acts.transient)
        if replicated:
            out += detail("kv_replicated", replicated)
    if s.tiled_mlp_shards > 1:
        dropped = acts.mlp_saved or mlp_saved_bytes(model, tokens, elem)
        shard = -(-dropped // s.tiled_mlp_shards)
        if s.activation_checkpointing:
            acts.recompute = max(0, acts.recompute - dropped) + shard
        else:
            acts.saved -= layers * dropped
            acts.recompute += shard
        out += detail("tiled_mlp_shard", shard)
    if s.tiled_loss_shards > 1:
        logits = tokens * model.vocab_size
        acts.saved += elem * tokens * model.hidden_size - FP32 * logits
        acts.outside = max(0, acts.outside + elem * tokens * model.hidden_size - FP32 * logits)
        shard_logits = -(-logits // s.tiled_loss_shards)
        acts.workspace = shard_workspace(elem, shard_logits)
        out += detail("tiled_loss_shard", acts.workspace)
    if s.activation_checkpointing:  # the recomputed layer's worst moment in backward, beyond its saved tensors
        acts.recompute_saved = acts.recompute
        worst = acts.peak_outside_mlp if s.tiled_mlp_shards > 1 else acts.peak
        if worst and worst + replicated > acts.recompute:
            acts.recompute = worst + replicated
            out += detail("recomputed_backward_peak", acts.recompute)
    if s.offload_checkpoints and s.activation_checkpointing:
        checkpoint = elem * tokens * model.hidden_size
        acts.host, acts.host_count = layers * checkpoint, layers
        acts.saved -= max(0, layers - IN_FLIGHT_CHECKPOINTS) * checkpoint
        out += detail("offloaded_checkpoints", acts.host)
    return acts, tuple(out)


class UlyssesTerms(LayoutTerms):
    """Ulysses in the estimator: its terms are the activations' (a rank's ``s/sp`` tokens, :func:`long_context_terms`
    called by :func:`tuner.estimator.activations.activation_phases.activation_terms`), no rank view or term beside
    them; its all-to-alls' time is :func:`tuner.estimator.throughput.prediction.long_context_seconds`."""

    kind = ULYSSES_KIND

    def group(self, ranks: Ranks) -> int:
        return ranks.sequence


ULYSSES = UlyssesTerms()


__all__ = [
    "ULYSSES",
    "Activations",
    "all_to_all_buffers",
    "all_to_all_bytes",
    "attention_output_bytes",
    "kv_replication_bytes",
    "local_seq",
    "long_context_terms",
    "mlp_params",
    "mlp_saved_bytes",
]
