"""Linear attention's contract: the Performer conversion at load, and the recurrent state's graphs and feed.

The state itself (Performer summaries, MiniMax's lightning layers) lives in worker/state_cache.py;
this strategy owns what the engine asks about it.
"""

from __future__ import annotations

from kvpilot.engine.metrics.stats_contract import FeedSections
from kvpilot.engine.models.minimax import LightningAttention
from kvpilot.engine.strategies.contract import BlockManagerLike, MemoryStrategy, Requeue, RunnerView
from kvpilot.engine.strategies.linear.apply import apply_linear
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from kvpilot.engine.strategies.linear.check import linear_checks
from kvpilot.engine.validation.runner import ApproximationCheck


def has_performer_layers(runner: RunnerView) -> bool:
    return any(isinstance(m, PerformerAttention) for m in runner.model.modules())


def kernel_decoded_state(runner: RunnerView) -> bool:
    """Every recurrent-state layer is MiniMax's lightning attention (one decode kernel over the pool)."""
    state = runner.linear_state
    return state is not None and all(type(layer) is LightningAttention for layer in state.layers)


class LinearStrategy(MemoryStrategy):
    name = "linear"

    @property
    def enabled(self) -> bool:
        return self.config.attention == "linear" and not self.config.disable_linear

    def load(self, runner: RunnerView, world: int) -> None:
        apply_linear(runner.model, self.config)  # Performer conversion of softmax layers

    def shares_blocks(self, runner: RunnerView) -> bool:
        return has_performer_layers(runner)  # its exact path is the full context over the same blocks

    def graph_blocker(self, runner: RunnerView) -> str | None:
        if runner.linear_state is not None and not kernel_decoded_state(runner):
            return "recurrent linear-attention state of a Performer conversion: per-sequence exact-path flags"
        if has_performer_layers(runner):
            return "converted attention layers (Performer): data-dependent forward"
        return None

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        return list(linear_checks(runner, block_manager, requeue, self.config.eviction != "none"))

    def feed(self, runner: RunnerView) -> FeedSections:
        state = runner.linear_state
        return {"linear": state.stats()} if state is not None else {}  # summary hits / misses
