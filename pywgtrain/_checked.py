"""The two-phase load that checkpoints need: ``check_state_dict`` validates a
state without changing anything and returns a ``CheckedState``; the same
object's ``load_state_dict`` then applies it without checking again. A loader
of several objects (``Trainer.load``) checks them all before it applies any."""

from __future__ import annotations

from typing import Any, Sequence


class CheckedState:
    """A state validated and normalized by ``owner.check_state_dict``; only ``owner``
    applies it (``owner.load_state_dict(checked)``). ``missing`` and ``unexpected`` name
    the keys a non-strict module check found absent or unknown."""

    __slots__ = ("owner", "value", "missing", "unexpected")

    def __init__(self, owner: Any, value: Any, missing: Sequence[str] = (), unexpected: Sequence[str] = ()) -> None:
        self.owner, self.value = owner, value
        self.missing, self.unexpected = list(missing), list(unexpected)

    def value_for(self, owner: Any) -> Any:
        """The checked value, for its owner only (another object's check proves nothing about this one)."""
        if self.owner is not owner:
            raise ValueError(
                f"load_state_dict: this CheckedState was made by {type(self.owner).__name__}.check_state_dict "
                f"of another object, not of this {type(owner).__name__}"
            )
        return self.value

    def __repr__(self) -> str:
        return f"<pywgtrain.CheckedState for {type(self.owner).__name__}>"
