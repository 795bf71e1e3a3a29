"""The experiments' registries: experiments found without a list, measurements with their cost."""

import pytest

from timerome import TimeromeError, load_backbone
from timerome.experiments import EXPERIMENTS
from timerome.experiments.runner import MEASURES, Cell, Context, check_cells, measurement, measurement_of


def test_every_experiment_is_found_without_a_list():
    names = list(EXPERIMENTS)
    assert names[0] == "canonical" and names[-1] == "radar"   # radar reads the others' outputs: last
    assert {"editing", "robustness", "sequential", "utility", "xbackbone"} <= set(names)
    orders = [m.ORDER for m in EXPERIMENTS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_a_measurement_brings_its_own_cost_to_the_budget():
    assert measurement_of("sequential").forwards is not measurement_of("lp").forwards  # its own, in sequential.py
    assert not measurement_of("reference").uses_method and measurement_of("reference").uses_reference
    ctx = Context(backbone=load_backbone())
    try:
        @measurement("probe_cost", forwards=lambda cell, rows, task: cell.options["n"])
        def probe(cell, ctx, rows, task):
            return {}

        check_cells([Cell("probe_cost", options={"n": 10})], ctx)          # within the budget
        with pytest.raises(TimeromeError, match="probe_cost|cells"):
            check_cells([Cell("probe_cost", options={"n": 10**12})], ctx)  # the registered cost is what counts
    finally:
        MEASURES.pop("probe_cost", None)
    with pytest.raises(TimeromeError, match="unknown measurement"):
        measurement_of("no_such_measurement")


def test_the_cli_lists_the_experiments_the_registry_runs():
    from timerome.cli.run import experiment_names

    assert experiment_names() == list(EXPERIMENTS)  # read from the files: the help costs no import
