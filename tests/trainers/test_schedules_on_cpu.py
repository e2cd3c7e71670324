"""Each pipelined mode's ``SCHEDULE`` reads its step top to bottom: the hooks of verl's V1 loop the mode overrides, in
the order verl calls them. Read against verl's own loop (trainer_base's fit -> step -> _step_once, parsed, not run)
and against the class, so the table cannot drift from either."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import pytest

from verl_pipe.trainer_modes import TRAINER_MODES, plugin_modes

# verl's loop calls these methods of its own, whose bodies hold more hooks: their calls are inlined, then the
# method itself counts as called once its body has run (a mode's override acts after super() returns).
INLINED = ("step", "_step_once")


def _self_calls(function) -> list[str]:
    """The ``self.<name>(...)`` calls of a method, in source order, with INLINED ones expanded (post-order)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_Call(self, node: ast.Call) -> None:
            self.generic_visit(node)  # arguments first: they run before the call
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                if func.attr in INLINED:
                    calls.extend(_self_calls(getattr(trainer_base().PPOTrainer, func.attr)))
                calls.append(func.attr)

    Visitor().visit(tree)
    return calls


def trainer_base():
    return importlib.import_module("verl.trainer.ppo.v1.trainer_base")


def verl_call_order() -> list[str]:
    return _self_calls(trainer_base().PPOTrainer.fit)


def _trainer_class(mode: str):
    import verl.trainer.ppo.v1.trainer_base  # noqa: F401 - registers the plugin's modes on import

    module = importlib.import_module(TRAINER_MODES[mode].module)
    (cls,) = [c for c in vars(module).values() if inspect.isclass(c) and getattr(c, "MODE", None) == mode]
    return cls


def _our_overrides(cls) -> set[str]:
    """Methods the class, or a verl-pipe base of it, defines."""
    return {name for klass in cls.__mro__ if klass.__module__.startswith("verl_pipe.") for name in vars(klass)}


def schedule_problems(schedule, overrides: set[str], order: list[str]) -> list[str]:
    problems = []
    hooks = [hook for hook, _ in schedule]
    position = 0
    for hook in hooks:  # in verl's order: each hook found after the one before it
        try:
            position = order.index(hook, position) + 1
        except ValueError:
            problems.append(f"{hook} is not called where the table puts it (verl's order: {order})")
            break
    problems += [f"{hook}: the mode does not override it" for hook in hooks if hook not in overrides]
    unlisted = sorted((overrides & set(order)) - set(hooks))
    problems += [f"{hook}: overridden and called by verl's loop, but not in the table" for hook in unlisted]
    return problems


def test_verls_loop_calls_the_hooks_in_the_order_the_tables_assume():
    order = verl_call_order()
    expected = ["on_train_begin", "on_step_begin", "prepare_step", "on_sample_begin", "on_sample_end",
                "_balance_batch", "_update_actor", "_step_once", "step", "_save_checkpoint", "on_step_end",
                "on_validate_begin", "on_validate_end", "_compute_metrics", "on_train_end"]  # fmt: skip
    assert schedule_problems([(hook, "") for hook in expected], set(expected), order) == []


@pytest.mark.parametrize("mode", plugin_modes())
def test_each_modes_schedule_reads_in_verls_order_and_lists_every_override(mode):
    cls = _trainer_class(mode)
    assert all(len(entry) == 2 and entry[1] for entry in cls.SCHEDULE), "each hook says what the mode does there"
    assert schedule_problems(cls.SCHEDULE, _our_overrides(cls), verl_call_order()) == []


def test_a_table_out_of_order_or_missing_a_hook_is_caught():
    """The controls: two hooks swapped, a hook the class does not override, and an override left out."""
    cls = _trainer_class("in_flight_pipeline")
    order, overrides = verl_call_order(), _our_overrides(cls)
    swapped = list(cls.SCHEDULE)
    first, last = swapped.index(("on_sample_end", dict(swapped)["on_sample_end"])), len(swapped) - 1
    swapped[first], swapped[last] = swapped[last], swapped[first]
    assert any("not called where the table puts it" in p for p in schedule_problems(swapped, overrides, order))
    invented = [*cls.SCHEDULE, ("on_step_begin", "something it never does")]
    assert "on_step_begin: the mode does not override it" in schedule_problems(invented, overrides, order)
    missing = [entry for entry in cls.SCHEDULE if entry[0] != "_save_checkpoint"]
    assert schedule_problems(missing, overrides, order) == [
        "_save_checkpoint: overridden and called by verl's loop, but not in the table"
    ]
