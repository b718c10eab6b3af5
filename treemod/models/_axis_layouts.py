"""The zoo's logical axis names (`tm.axis_names`), shared by the families' declarations.

Megatron's layout for every family: attention's query, key and value projections are split by
output (`heads`), its output projection by input (`heads`); an MLP's up projection by output
(`mlp`, `nn.Linear`'s default), its down projection by input (`mlp`); vocabulary tables and
heads by `vocab`; position tables are named only on `embed`. `nn.Linear` stores
`(out, in)`, so an output projection is `("embed", "heads")`.
"""

from __future__ import annotations

from treemod._sharding.axes import AxisNames

__all__ = ["attention_in", "attention_out", "mlp_out", "positions", "vocab_head"]


def attention_in(*names: str) -> dict[str, AxisNames]:
    """Query/key/value projections (fused ones too) `names`: split by output heads.

    Arguments:
        names: the projections' field names (dotted paths).

    Returns:
        `{"<name>.weight": ("heads", "embed"), "<name>.bias": ("heads",)}` for each.

    Example:
        >>> attention_in("q")["q.weight"]
        ('heads', 'embed')
    """
    return {
        f"{name}.{field}": axes
        for name in names
        for field, axes in (("weight", ("heads", "embed")), ("bias", ("heads",)))
    }


def attention_out(name: str) -> dict[str, AxisNames]:
    """An attention output projection `name`: split by input heads; its bias is `embed`.

    Arguments:
        name: the projection's field name.

    Returns:
        The weight's and bias's names.

    Example:
        >>> attention_out("o")["o.weight"]
        ('embed', 'heads')
    """
    return {f"{name}.weight": ("embed", "heads"), f"{name}.bias": ("embed",)}


def mlp_out(name: str) -> dict[str, AxisNames]:
    """An MLP's down projection `name`: split by input hidden units; its bias is `embed`.

    Arguments:
        name: the projection's field name.

    Returns:
        The weight's and bias's names.

    Example:
        >>> mlp_out("fc2")["fc2.weight"]
        ('embed', 'mlp')
    """
    return {f"{name}.weight": ("embed", "mlp"), f"{name}.bias": ("embed",)}


def vocab_head(name: str) -> dict[str, AxisNames]:
    """A projection `name` onto the vocabulary: split by `vocab`.

    Arguments:
        name: the head's field name.

    Returns:
        The weight's and bias's names.

    Example:
        >>> vocab_head("lm_head")["lm_head.weight"]
        ('vocab', 'embed')
    """
    return {f"{name}.weight": ("vocab", "embed"), f"{name}.bias": ("vocab",)}


def positions(*names: str) -> dict[str, AxisNames]:
    """Position (or token-type) tables `names` (`nn.Embedding`s): named on `embed` only.

    Their rows are positions, not a vocabulary: TP leaves them whole, FSDP splits `embed`.

    Arguments:
        names: the tables' field names.

    Returns:
        `{"<name>.weight": (None, "embed")}` for each.

    Example:
        >>> positions("wpe")
        {'wpe.weight': (None, 'embed')}
    """
    return {f"{name}.weight": (None, "embed") for name in names}
