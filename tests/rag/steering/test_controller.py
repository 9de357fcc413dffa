"""The level controller (rag/steering/controller.py) driven by readings on a clock of the test's own: it steps down
under pressure (as far as the demand needs), holds at steady load, steps back up once the load falls, and backs off
a step up that did not hold."""

from __future__ import annotations

import pytest

from rag.steering.controller import BREAK_MEMORY_S, LevelController, Reading

LEVELS = ("full", "shallow_rerank", "no_rerank", "bm25_only")
PRIOR_MS = {"full": 6.0, "shallow_rerank": 5.0, "no_rerank": 4.0, "bm25_only": 0.3}
OVERHEAD_S = 0.010  # what every answer costs besides the pipeline (HTTP, bookkeeping)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cost_s(level: str) -> float:
    return OVERHEAD_S + {**PRIOR_MS, "light_search": 3.6}[level] / 1000


def make(**options) -> tuple[LevelController, Clock]:
    clock = Clock()
    return LevelController(LEVELS, PRIOR_MS, cores=2.0, clock=clock, **options), clock


def load(controller: LevelController, clock: Clock, rate: float, seconds: int, cores: float = 2.0,
         shed_when_over: bool = True, true_cost=cost_s) -> list:
    """``seconds`` one-second ticks of ``rate`` arrivals per second; answered at the current rung's cost
    (``true_cost``) up to the cores, the rest refused (with ``shed_when_over``)."""
    changes = []
    for _ in range(seconds):
        clock.now += 1.0
        cost = true_cost(controller.level)
        capacity = cores / cost
        answered = min(rate, capacity)
        shed = int(rate - answered) if shed_when_over else 0
        reading = Reading(seconds=1.0, arrived=int(rate), answered=int(answered), shed=shed,
                          cpu_s=answered * cost, waiting=0, predicted_s=0.0, deadline_s=0.42)
        if (change := controller.tick(reading)) is not None:
            changes.append(change)
    return changes


def test_steady_load_under_capacity_changes_nothing():
    controller, clock = make()
    capacity = 2.0 / cost_s("full")
    assert load(controller, clock, 0.5 * capacity, 120) == []
    assert controller.level == "full"


def test_overload_steps_down_as_far_as_the_demand_needs_and_holds_there():
    controller, clock = make()
    full_capacity = 2.0 / cost_s("full")
    load(controller, clock, 0.3 * full_capacity, 10)  # learns the top rung's live cost
    changes = load(controller, clock, 1.5 * full_capacity, 60)
    assert changes and changes[0].direction == "down"
    # 1.5x of full's capacity is more than every reranked rung can answer; BM25 alone holds it
    assert controller.level == "bm25_only"
    assert len(changes) <= 2, changes  # no oscillation at steady load
    assert all(c.direction == "down" for c in changes)


def test_a_queue_predicted_past_half_the_deadline_for_two_readings_is_pressure_even_without_refusals():
    controller, clock = make()
    queued = Reading(1.0, 10, 10, 0, 0.1, waiting=30, predicted_s=0.3, deadline_s=0.42)
    clock.now += 10
    assert controller.tick(queued) is None, "one reading's queue may be a burst the next tick has drained"
    clock.now += 1
    change = controller.tick(queued)
    assert change is not None and change.direction == "down" and "waiting" in change.why


def test_a_long_queue_that_drains_is_not_pressure():
    """At the knee a second of random arrivals leaves a queue the next seconds drain: only one that does not fall
    is the load's."""
    controller, clock = make()
    clock.now += 10
    for predicted_s in (0.35, 0.3, 0.25):
        clock.now += 1
        assert controller.tick(Reading(1.0, 150, 150, 0, 1.5, 30, predicted_s, 0.42)) is None, predicted_s
    clock.now += 1
    change = controller.tick(Reading(1.0, 150, 150, 0, 1.5, 30, 0.26, 0.42))
    assert change is not None and change.direction == "down" and "waiting" in change.why


def stepped_down(overload_s: int) -> tuple[LevelController, Clock, float]:
    """A controller that learned full's cost at a light load, then stepped down under twice full's capacity for
    ``overload_s`` seconds; with full's capacity (answers/s)."""
    controller, clock = make(hold_s=5.0)
    full_capacity = 2.0 / cost_s("full")
    load(controller, clock, 0.3 * full_capacity, 10)
    load(controller, clock, 2.0 * full_capacity, overload_s)
    assert controller.level != "full"
    return controller, clock, full_capacity


def test_no_step_up_in_a_tick_that_refused_even_when_it_was_not_pressure():
    controller, clock, full_capacity = stepped_down(5)
    load(controller, clock, 0.3 * full_capacity, 3)  # within the hold
    clock.now += 10  # the hold is over
    rate = 0.3 * full_capacity
    refused = Reading(1.0, int(rate), int(rate) - 2, 2, 0.3 * 2.0, 0, 0.0, 0.42)  # under a tenth: not pressure
    assert controller.tick(refused) is None, "refusals, even a few, are no time to ask for more"
    clock.now += 1
    calm = Reading(1.0, int(rate), int(rate), 0, 0.3 * 2.0, 0, 0.0, 0.42)
    change = controller.tick(calm)
    assert change is not None and change.direction == "up"


def test_one_refusal_in_a_busy_tick_is_not_pressure():
    controller, clock = make()
    clock.now += 10
    assert controller.tick(Reading(1.0, 150, 149, 1, 1.5, 0, 0.0, 0.42)) is None
    clock.now += 1
    change = controller.tick(Reading(1.0, 150, 110, 40, 1.5, 0, 0.0, 0.42))
    assert change is not None and change.direction == "down", "past three spreads of the arrivals refused at once"


def test_a_second_of_random_arrivals_refused_in_part_is_not_pressure_however_the_ticks_cut_it():
    """At the knee rate a Poisson second now and then brings a sixth more than the rate, and the queue cannot absorb
    all of it: what is refused is within the second's chance excess, alone or split over two readings."""
    controller, clock = make()
    calm = Reading(1.0, 160, 160, 0, 1.2, 0, 0.0, 0.42)
    for _ in range(5):
        clock.now += 1
        assert controller.tick(calm) is None
    for shed in ((2, 20), (10, 10), (20,), (12, 0, 11)):
        for refused in shed:
            clock.now += 1
            arrived = 178 if refused else 160
            assert controller.tick(Reading(1.0, arrived, arrived - refused, refused, 1.2, 0, 0.0, 0.42)) is None
        for _ in range(5):
            clock.now += 1
            assert controller.tick(calm) is None
    assert controller.level == "full"


def test_refusals_past_the_spread_are_pressure_only_in_two_ticks_running():
    """More refused than a second of random arrivals strays from the rate, yet under three spreads: pressure once it
    lasts into a second reading."""
    controller, clock = make()
    few, none = Reading(1.0, 150, 132, 18, 1.5, 0, 0.0, 0.42), Reading(1.0, 150, 150, 0, 1.5, 0, 0.0, 0.42)
    for reading in (few, none, few, none, none, few):
        clock.now += 1
        assert controller.tick(reading) is None
    clock.now += 1
    change = controller.tick(few)
    assert change is not None and change.direction == "down" and "refused" in change.why


def test_steps_back_up_to_full_once_the_load_falls():
    controller, clock, full_capacity = stepped_down(20)
    changes = load(controller, clock, 0.3 * full_capacity, 40)
    assert controller.level == "full"
    assert [c.direction for c in changes] == ["up"] * len(changes)
    # one rung per hold: back within (rungs x hold) plus a tick each
    assert len(changes) <= len(LEVELS) - 1


def test_near_the_knee_it_settles_instead_of_flapping():
    controller, clock = make(hold_s=5.0)
    full_capacity = 2.0 / cost_s("full")
    load(controller, clock, 0.3 * full_capacity, 10)
    changes = load(controller, clock, 0.95 * full_capacity, 300)
    per_minute = len(changes) / 5
    assert per_minute <= 2, changes


def test_a_step_up_that_does_not_hold_doubles_the_wait_before_the_next():
    controller, clock = make(hold_s=5.0)
    full_capacity = 2.0 / cost_s("full")
    load(controller, clock, 0.3 * full_capacity, 10)
    load(controller, clock, 2.0 * full_capacity, 10)
    up = load(controller, clock, 0.3 * full_capacity, 7)
    assert up and up[-1].direction == "up"
    down = load(controller, clock, 2.0 * full_capacity, 2)  # the load came back at once
    assert down and down[0].direction == "down"
    assert controller.hold_s == pytest.approx(10.0)


def test_load_episodes_apart_each_start_from_the_usual_hold():
    """A step up that held resets the hold: separate bursts are not read as one flapping load."""
    controller, clock = make(hold_s=5.0)
    full_capacity = 2.0 / cost_s("full")
    load(controller, clock, 0.3 * full_capacity, 10)
    for _ in range(4):
        load(controller, clock, 2.0 * full_capacity, 15)
        assert controller.level != "full"
        back = load(controller, clock, 0.2 * full_capacity, 30)
        assert controller.level == "full", back
        assert controller.hold_s == 5.0


def test_a_costly_start_does_not_keep_it_below_full_quality():
    """The first answers after a start cost many times the steady ones (lazy state, cold pages, a machine still busy
    starting): the controller steps down on them, and must come back once answers cost what they do, though it has not
    answered at the top rung since."""
    controller, clock = make(hold_s=5.0)
    light = 0.1 * 2.0 / cost_s("full")  # a tenth of the cores at full quality, once warm
    for _ in range(5):  # warming up at full: twenty times the steady cost per answer
        clock.now += 1.0
        controller.tick(Reading(1.0, int(light), int(light), 0, 20 * light * cost_s("full"), 0, 0.0, 0.42))
    assert controller.level != "full"
    changes = load(controller, clock, light, 120)
    assert controller.level == "full", (changes, controller.learned_s)


def test_priority_low_is_served_one_rung_below_once_stepped_down_and_high_one_above():
    controller, clock = make()
    assert controller.level_for("low") == "full"  # nothing to save at full load-free service
    controller.index = 1
    assert controller.level_for("normal") == "shallow_rerank"
    assert controller.level_for("low") == "no_rerank"
    assert controller.level_for("high") == "full"
    controller.index = len(LEVELS) - 1
    assert controller.level_for("low") == "bm25_only"


def test_an_unmeasured_rung_is_priced_from_the_ladder_by_difference():
    controller, clock = make()
    controller.learned_s["full"] = 0.016
    assert controller.cost_s("no_rerank") == pytest.approx(0.016 - 0.002)
    assert controller.cost_s("bm25_only") == pytest.approx(0.016 - 0.0057)


def test_bad_thresholds_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="under down_at"):
        LevelController(LEVELS, PRIOR_MS, 2.0, up_at=0.9, settle_at=0.8, down_at=0.85)
    with pytest.raises(ValueError, match="under down_at"):
        LevelController(LEVELS, PRIOR_MS, 2.0, up_at=0.7, settle_at=1.0, down_at=0.95)


# A service that turns only part of its cores into answers (the event loop and the interpreter's lock serialise part
# of every answer, a load generator shares the machine): saturated, it reaches this many cores, not the two it has.
EFFECTIVE_CORES = 1.3


def saturate(controller: LevelController, clock: Clock, level: str, cpu: float, ticks: int = 3,
             waiting: int = 40, predicted_s: float = 0.3) -> None:
    """``ticks`` seconds at ``level`` (held there: the controller's own steps do not count) with a queue of
    ``waiting`` whose newcomer would finish in ``predicted_s``, the process at ``cpu`` cores."""
    for _ in range(ticks):
        controller.index = controller.levels.index(level)
        clock.now += 1.0
        controller.tick(Reading(1.0, 300, 100, 0, cpu, waiting=waiting, predicted_s=predicted_s, deadline_s=0.42))


def test_the_capacity_is_the_cpu_rate_a_saturated_service_reaches_and_each_saturated_stretch_learns_it_anew():
    controller, clock = make()
    assert controller.capacity("full") == 2.0  # nothing seen yet: the cores
    full = EFFECTIVE_CORES / cost_s("full")
    load(controller, clock, 0.5 * full, 10, cores=EFFECTIVE_CORES)
    assert controller.learned_capacity == {}, "a service that kept up says nothing of what it can do"
    saturate(controller, clock, "full", EFFECTIVE_CORES)
    assert controller.capacity("full") == pytest.approx(EFFECTIVE_CORES)
    load(controller, clock, 0.3 * full, 200, cores=EFFECTIVE_CORES)
    assert controller.capacity("full") == pytest.approx(EFFECTIVE_CORES), "kept while nothing says otherwise"
    load(controller, clock, 0.3 * full, 2, cores=EFFECTIVE_CORES)
    saturate(controller, clock, "full", 1.6)  # a neighbour left: the next saturated stretch says so
    assert controller.capacity("full") == pytest.approx(1.6)


def test_at_the_knee_a_burst_tick_steps_down_and_full_quality_comes_back_within_a_hold():
    """At the highest rate full quality holds, Poisson arrivals now and then bring a second that is refused in part:
    the controller steps down on it, and must come back to full although full's demand is near the capacity."""
    controller, clock = make(hold_s=5.0)
    full = EFFECTIVE_CORES / cost_s("full")
    load(controller, clock, 0.97 * full, 20, cores=EFFECTIVE_CORES)
    assert controller.level == "full"
    down = load(controller, clock, 1.3 * full, 2, cores=EFFECTIVE_CORES)  # a burst second, then one more
    assert down and down[0].direction == "down"
    back = load(controller, clock, 0.97 * full, 7, cores=EFFECTIVE_CORES)
    assert controller.level == "full", (back, controller.learned_s, controller.learned_capacity)
    assert load(controller, clock, 0.97 * full, 300, cores=EFFECTIVE_CORES) == []


def test_past_the_knee_it_settles_below_full_and_does_not_retry_a_rung_that_failed_at_this_load():
    controller, clock = make(hold_s=5.0)
    full = EFFECTIVE_CORES / cost_s("full")
    load(controller, clock, 0.3 * full, 10, cores=EFFECTIVE_CORES)
    first_minute = load(controller, clock, 1.5 * full, 60, cores=EFFECTIVE_CORES)
    assert controller.level != "full"
    assert len(first_minute) <= 3, first_minute  # the step down, and at most one trial that fails
    trials: list[tuple[float, str]] = []
    changes = []
    for _ in range(240):
        for change in load(controller, clock, 1.5 * full, 1, cores=EFFECTIVE_CORES):
            changes.append(change)
            if change.direction == "up":
                trials.append((clock.now, change.after))
    assert len(changes) / 4 <= 2, changes  # at most two changes a minute at steady load
    assert controller.level != "full"
    for when, rung in trials:  # a trial that failed is not repeated at the same load while it is remembered
        assert not [t for t, r in trials if r == rung and 0 < t - when < BREAK_MEMORY_S], trials


def contended(level: str) -> float:
    """Under load a rung costs more than the ladder's quiet difference from a cheaper one says (contention)."""
    return cost_s(level) * (1.0 if level == "bm25_only" else 1.3)


def contended_ladder() -> tuple[LevelController, Clock, float]:
    """A controller over five rungs of a contended service, warmed at light load; and full quality's capacity."""
    clock = Clock()
    levels = ("full", "shallow_rerank", "no_rerank", "light_search", "bm25_only")
    controller = LevelController(levels, {**PRIOR_MS, "light_search": 3.6}, cores=2.0, clock=clock, hold_s=5.0)
    full = EFFECTIVE_CORES / contended("full")
    load(controller, clock, 0.3 * full, 10, cores=EFFECTIVE_CORES, true_cost=contended)
    return controller, clock, full


def test_when_a_trial_fails_only_clear_headroom_is_tried_for_a_while():
    """Trials priced by the ladder's quiet differences fail under contention, and one failure must make the
    controller cautious rather than try each rung in turn."""
    controller, clock, full = contended_ladder()
    first_minute = load(controller, clock, 1.4 * full, 60, cores=EFFECTIVE_CORES, true_cost=contended)
    assert any(c.direction == "up" for c in first_minute), "the setting of this test no longer makes a trial"
    # the way down (two steps when the first is sized before the capacity is known), one trial, its failure
    assert [c.direction for c in first_minute].count("up") == 1 and len(first_minute) <= 4, first_minute
    later = load(controller, clock, 1.4 * full, 240, cores=EFFECTIVE_CORES, true_cost=contended)
    assert len(later) / 4 <= 2, later


def test_once_the_load_falls_a_failed_trial_no_longer_holds_the_climb_back():
    controller, clock = make(hold_s=5.0)
    full = EFFECTIVE_CORES / contended("full")
    load(controller, clock, 0.3 * full, 10, cores=EFFECTIVE_CORES, true_cost=contended)
    load(controller, clock, 1.4 * full, 40, cores=EFFECTIVE_CORES, true_cost=contended)
    assert controller.hold_s > 5.0 and controller.level != "full"  # a trial failed: a longer hold at this load
    load(controller, clock, 0.3 * full, 7, cores=EFFECTIVE_CORES, true_cost=contended)
    assert controller.level == "full" and controller.hold_s == 5.0


def test_a_rung_that_came_under_pressure_is_tried_again_once_the_load_is_clearly_lower():
    controller, clock = make(hold_s=5.0)
    full = EFFECTIVE_CORES / cost_s("full")
    load(controller, clock, 0.3 * full, 10, cores=EFFECTIVE_CORES)
    load(controller, clock, 1.2 * full, 20, cores=EFFECTIVE_CORES)
    rate, _ = controller.broke_at["full"]
    assert controller.level != "full"
    load(controller, clock, 0.8 * full, 30, cores=EFFECTIVE_CORES)
    assert controller.level == "full" and 0.8 * full < 0.9 * rate


def test_a_second_of_random_arrivals_is_not_a_burst_but_a_multiple_of_the_load_is():
    controller, clock = make()
    for arrived in (100, 100, 100, 100):
        clock.now += 1.0
        controller.tick(Reading(1.0, arrived, arrived, 0, 0.5, 0, 0.0, 0.42))
    clock.now += 1.0
    controller.tick(Reading(1.0, 125, 125, 0, 0.6, 0, 0.0, 0.42))
    window = controller.arrival_rate()
    assert controller.arrival_rate(rising=True) == window == pytest.approx(105.0)
    assert controller.arrival_rate(peak=True) == 125.0  # the rate a rung came under pressure at is the second's own
    clock.now += 1.0
    controller.tick(Reading(1.0, 400, 100, 0, 0.6, 0, 0.0, 0.42))
    assert controller.arrival_rate(rising=True) == 400.0


def test_a_short_queue_at_two_readings_teaches_nothing_of_the_capacity():
    """Random arrivals leave a short queue at a reading now and then at any load; only a long queue (or refusals)
    that lasts through a tick says the process ran saturated."""
    controller, clock = make()
    saturate(controller, clock, "full", 0.4, ticks=5, waiting=3, predicted_s=0.02)
    assert controller.learned_capacity == {}
    saturate(controller, clock, "full", 1.3, ticks=2)
    assert controller.capacity("full") == pytest.approx(1.3)


def test_each_rung_has_the_capacity_it_reached_saturated():
    """A cheap answer is mostly the event loop's work on one core, a reranked one the model's on every core: a
    saturated floor does not make the top rung look as if it could use only what the floor could."""
    controller, clock = make()
    saturate(controller, clock, "full", 1.3)
    saturate(controller, clock, "bm25_only", 0.9)
    assert controller.capacity("full") == pytest.approx(1.3)
    assert controller.capacity("bm25_only") == pytest.approx(0.9)
    assert controller.capacity("no_rerank") == 2.0  # not seen saturated: the cores, until a trial says otherwise


def test_a_tick_that_began_at_another_rung_teaches_no_capacity():
    """After a step down the queue left by the rung above drains at the cheaper one, at a fraction of the CPU: that
    tick says nothing of what either rung can do."""
    controller, clock = make()
    saturated = Reading(1.0, 300, 100, 0, 1.3, waiting=40, predicted_s=0.3, deadline_s=0.42)
    clock.now += 1.0
    controller.tick(saturated)
    controller.index = LEVELS.index("bm25_only")  # as a step down leaves it
    clock.now += 1.0
    controller.tick(Reading(1.0, 300, 300, 0, 0.4, waiting=40, predicted_s=0.3, deadline_s=0.42))
    assert "bm25_only" not in controller.learned_capacity


def test_random_arrivals_past_the_knee_do_not_make_the_lessons_lapse():
    """Per-second arrivals scatter around the rate (Poisson): a lesson kept at one second's peak and compared with
    the window's average would lapse at the next calm second, and trials would follow each other."""
    import numpy as np

    controller, clock, full = contended_ladder()
    rng, changes = np.random.default_rng(1), []
    for _ in range(600):
        changes += load(controller, clock, int(rng.poisson(1.4 * full)), 1, cores=EFFECTIVE_CORES,
                        true_cost=contended)
    assert len(changes) / 10 <= 2, [(c.direction, c.after) for c in changes]
