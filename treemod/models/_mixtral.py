"""Mixtral: the Llama implementation with a sparse mixture of experts in place of the MLP.

Each layer's `mlp` routes every token to `num_experts_per_tok` of `num_local_experts` SwiGLU
experts as `transformers` does: router logits `gate(x)`, their float32 softmax, the top k
probabilities renormalised to sum to one, and the experts' outputs weighted by them. The
experts are held in two stacked arrays, `gate_up_proj` `(experts, 2 * intermediate, hidden)`
(gate rows first) and `down_proj` `(experts, hidden, intermediate)`, and run as grouped matrix
products over the tokens sorted by expert (`jax.lax.ragged_dot`), so the work grows with `k`,
not with the number of experts (on CPU, where XLA's grouped product is slow, every expert runs
on every token and the unchosen ones weigh zero). Files hold the layout `transformers` 5
writes: per expert `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up) and `w2` (down), and
`block_sparse_moe.gate`; `tm.state_dict` names them so (with `mlp` for `block_sparse_moe`).
A sliding window, if set, is on every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod._state_dict.hooks import register_state_dict_hooks
from treemod._tree.tree_at import tree_at
from treemod.models._base import config_error, register_architecture
from treemod.models._config_values import Value, check_value
from treemod.models._hf_activations import get_activation
from treemod.models._llama import COMMON_VALUES, LlamaForCausalLM, LlamaModel
from treemod.models._llama_layers import LayerParts, Linear
from treemod.models._llama_variants import sliding_window

__all__ = [
    "MIXTRAL_VALUES",
    "MixtralExperts",
    "MixtralForCausalLM",
    "MixtralModel",
    "MixtralSparseMoeBlock",
]

MIXTRAL_VALUES: dict[str, Value] = {
    **COMMON_VALUES,
    "intermediate_size": Value(14336, "size"),
    "num_key_value_heads": Value(8, "size", nullable=True),
    "max_position_embeddings": Value(4096 * 32, "size"),
    "rms_norm_eps": Value(1e-5),
    "sliding_window": Value(None, "size", nullable=True),
    "num_experts_per_tok": Value(2, "size"),
    "num_local_experts": Value(8, "size"),
    "output_router_logits": Value(False, "bool"),
    "router_aux_loss_coef": Value(0.001),
    "router_jitter_noise": Value(0.0),
}
"""The values `MixtralConfig` reads, with its defaults."""

# transformers 5's conversion mapping for Mixtral: the files keep `block_sparse_moe`.
LOAD_RENAMES = ((r"\.block_sparse_moe\.", ".mlp."),)
SAVE_RENAMES = ((r"\.mlp\.", ".block_sparse_moe."),)


@axis_names({"gate_up_proj": ("experts", "mlp", "embed"), "down_proj": ("experts", "embed", "mlp")})
class MixtralExperts(Module):
    """`num_local_experts` SwiGLU experts in two stacked arrays.

    Arguments:
        gate_up_proj: `(experts, 2 * intermediate, hidden)`, each expert's gate rows then up.
        down_proj: `(experts, hidden, intermediate)`.
        act: the activation's name.
    """

    gate_up_proj: Array
    down_proj: Array
    act: str = field(static=True)

    def __call__(
        self, x: Array, index: Array, weights: Array, *, grouped: bool | None = None
    ) -> Array:
        """Each token's experts' outputs, weighted and summed.

        Arguments:
            x: `(tokens, hidden)`.
            index: `(tokens, k)` the chosen experts.
            weights: `(tokens, k)` float32 routing weights.
            grouped: run only the chosen experts as grouped products (`ragged_dot`), or every
                expert on every token, weighted by zero where not chosen; by default grouped
                except on CPU, where XLA's grouped product is slower than the dense one
                (2.5x at 8 experts, k 2, 128 tokens).

        Returns:
            `(tokens, hidden)` in `x`'s dtype.
        """
        if grouped is None:
            grouped = jax.default_backend() != "cpu"
        experts = self.gate_up_proj.shape[0]
        act = get_activation(self.act)
        if not grouped:
            gate_up = jnp.einsum("th,eih->eti", x, self.gate_up_proj)
            half = gate_up.shape[-1] // 2
            out = jnp.einsum(
                "eti,ehi->eth", act(gate_up[..., :half]) * gate_up[..., half:], self.down_proj
            )
            rows = jax.lax.iota(jnp.int32, x.shape[0])[:, None]
            share = jnp.zeros((x.shape[0], experts), jnp.float32).at[rows, index].set(weights)
            # transformers weights in float32 and adds each expert's share in the model's dtype.
            out = (out.astype(jnp.float32) * jnp.swapaxes(share, 0, 1)[..., None]).astype(x.dtype)
            return jnp.sum(out, axis=0)
        k = index.shape[1]
        flat = index.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        token_of = order // k
        sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
        gate_up = jax.lax.ragged_dot(x[token_of], jnp.swapaxes(self.gate_up_proj, 1, 2), sizes)
        half = gate_up.shape[-1] // 2
        h = act(gate_up[:, :half]) * gate_up[:, half:]
        out = jax.lax.ragged_dot(h, jnp.swapaxes(self.down_proj, 1, 2), sizes)
        out = (out.astype(jnp.float32) * weights.reshape(-1)[order][:, None]).astype(x.dtype)
        return jnp.zeros_like(x).at[token_of].add(out)


@axis_names({"gate.weight": ("experts", "embed")})
class MixtralSparseMoeBlock(Module):
    """Top-k routing over `experts`: `gate` the router, `(experts, hidden)` without bias."""

    gate: nn.Linear
    experts: MixtralExperts
    top_k: int = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Apply the mixture to `(batch, seq, hidden)` (`key`: the router's, for LoRA dropout;
        the experts are stacked arrays, which LoRA does not wrap)."""
        batch, seq, hidden = x.shape
        flat = x.reshape(-1, hidden)
        probs = jax.nn.softmax(self.gate(flat, key=key).astype(jnp.float32), axis=-1)
        top, index = jax.lax.top_k(probs, self.top_k)
        top = top / jnp.sum(top, axis=-1, keepdims=True)
        return self.experts(flat, index, top).reshape(batch, seq, hidden)


def _experts_to_torch(experts: MixtralExperts) -> dict[str, Any]:
    half = experts.gate_up_proj.shape[1] // 2
    out = {}
    for e in range(experts.gate_up_proj.shape[0]):
        out[f"{e}.w1.weight"] = experts.gate_up_proj[e, :half]
        out[f"{e}.w3.weight"] = experts.gate_up_proj[e, half:]
        out[f"{e}.w2.weight"] = experts.down_proj[e]
    return out


def _experts_from_torch(experts: MixtralExperts, t: Mapping[str, Any]) -> MixtralExperts:
    n = experts.gate_up_proj.shape[0]
    gate_up = jnp.stack(
        [jnp.concatenate([t[f"{e}.w1.weight"], t[f"{e}.w3.weight"]], axis=0) for e in range(n)]
    )
    down = jnp.stack([t[f"{e}.w2.weight"] for e in range(n)])
    new: MixtralExperts = tree_at(lambda m: (m.gate_up_proj, m.down_proj), experts, (gate_up, down))
    return new


# The files' per-expert tensors are views of the stacked arrays.
register_state_dict_hooks(
    MixtralExperts, to_torch=_experts_to_torch, from_torch=_experts_from_torch
)


def _moe(
    values: Mapping[str, Any], linear: Linear, dtype: Any, next_key: Callable[[], PRNGKeyArray]
) -> Any:
    hidden, inner = values["hidden_size"], values["intermediate_size"]
    experts = values["num_local_experts"]
    init = nn.init.normal(values["initializer_range"])
    return MixtralSparseMoeBlock(
        gate=linear(hidden, experts, False),
        experts=MixtralExperts(
            gate_up_proj=init(next_key(), (experts, 2 * inner, hidden), dtype),
            down_proj=init(next_key(), (experts, hidden, inner), dtype),
            act=values["hidden_act"],
        ),
        top_k=values["num_experts_per_tok"],
    )


class MixtralModel(LlamaModel):
    """Mixtral's decoder: `LlamaModel` with a sparse mixture of experts as each MLP.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.mixtral import MixtralModel
        >>> config = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        ...           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        ...           "num_local_experts": 4, "num_experts_per_tok": 2}
        >>> model = MixtralModel.from_config(config, key=jax.random.key(0))
        >>> model.layers.layers.mlp.experts.gate_up_proj.shape
        (2, 4, 96, 32)
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 32)
    """

    architecture: ClassVar[str] = "MixtralModel"
    model_type: ClassVar[str] = "mixtral"
    config_values: ClassVar[Mapping[str, Value]] = MIXTRAL_VALUES
    config_aliases: ClassVar[Mapping[str, str]] = {"num_experts": "num_local_experts"}
    layer_parts: ClassVar[LayerParts] = LayerParts(mlp=_moe)
    load_renames: ClassVar[tuple[tuple[str, str], ...]] = LOAD_RENAMES
    save_renames: ClassVar[tuple[tuple[str, str], ...]] = SAVE_RENAMES

    @classmethod
    def variant_rules(cls, owner: str, v: dict[str, Any]) -> None:
        """No biases; `sliding_window` on every layer; `num_experts_per_tok` at most
        `num_local_experts`; router jitter and returned router logits refused."""
        v["qkv_bias"], v["o_bias"], v["mlp_bias"] = False, False, False
        v["sliding_window"] = window = sliding_window(owner, v["sliding_window"])
        v["layer_kinds"] = tuple(int(window is not None) for _ in range(v["num_hidden_layers"]))
        k, experts = v["num_experts_per_tok"], v["num_local_experts"]
        if k > experts:
            raise config_error(
                owner, "num_experts_per_tok", k, f"at most num_local_experts={experts}"
            )
        if v["router_jitter_noise"]:
            raise config_error(
                owner, "router_jitter_noise", v["router_jitter_noise"], "0.0 (no router noise)"
            )
        if v["output_router_logits"]:
            raise config_error(
                owner,
                "output_router_logits",
                True,
                "false (treemod returns the logits only, not the router logits or aux loss)",
            )
        check_value(owner, "router_aux_loss_coef", v["router_aux_loss_coef"], "any")


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "MixtralForCausalLM"
    model_type: ClassVar[str] = "mixtral"
    body: ClassVar[type[LlamaModel]] = MixtralModel
    load_renames: ClassVar[tuple[tuple[str, str], ...]] = LOAD_RENAMES
    save_renames: ClassVar[tuple[tuple[str, str], ...]] = SAVE_RENAMES


register_architecture(MixtralModel)
register_architecture(MixtralForCausalLM)
