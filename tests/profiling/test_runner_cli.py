"""Micro-benchmark runner, timing harness, collectives and the `planner profile` CLI."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from cost_model.errors import InvalidProfile
from cost_model.profiles import validate_profile
from planner_service.profiling import ProfileOptions, numpy_backend, run_profile
from planner_service.profiling.runner import parse_device
from planner_service.profiling.timing import TimingSettings, measure

FIXTURE_TRACE = __import__("pathlib").Path(__file__).parent / "fixtures" / "gpu_trace.json"


@pytest.fixture
def tiny_numpy_plan(monkeypatch):
    """A handful of the numpy cases, so a run takes a fraction of a second."""
    full = numpy_backend.plan

    def tiny(quick):
        cases = full(True)
        gemms = [c for c in cases if c.fields["op"] == "gemm" and c.fields["shape"]["m"] <= 256
                 and c.fields["shape"]["n"] <= 256 and c.fields["shape"]["k"] <= 256 and c.fields["shape"]["batch"] == 1]
        mems = [c for c in cases if c.fields["op"] == "add" and c.fields["shape"]["elements"] <= 1 << 18]
        return gemms + mems

    monkeypatch.setattr(numpy_backend, "plan", tiny)


def test_measure_counts_calls_and_orders_the_spread():
    calls = []
    settings = TimingSettings(warmup=2, repeats=4, min_repeats=2, min_sample_s=0.0, budget_s=10.0)
    t = measure(lambda: calls.append(1), settings)
    assert t.inner == 1 and t.repeats == 4
    assert len(calls) == 1 + 2 + 4  # sizing call, warm-up, samples
    assert t.min_s <= t.seconds <= t.max_s and t.iqr_s >= 0


def test_measure_batches_fast_calls_into_longer_samples():
    calls = []
    settings = TimingSettings(warmup=0, repeats=3, min_repeats=3, min_sample_s=1e-3, budget_s=10.0)
    t = measure(lambda: calls.append(1), settings)
    assert t.inner > 10  # an append takes far less than 1 ms
    assert len(calls) == 1 + 3 * t.inner


def test_numpy_profile_is_valid_and_fits(tiny_numpy_plan):
    seen = []
    prof = run_profile(ProfileOptions(quick=True, backends=("numpy",), collectives=False, threads=1),
                       progress=lambda label, done, total: seen.append((done, total)))
    validate_profile(prof)
    assert prof["device"]["name"] == "local-cpu" and prof["device"]["threads"] == 1
    assert prof["settings"]["backends"] == ["numpy"]
    assert {m["op"] for m in prof["measurements"]} == {"gemm", "add"}
    assert all(m["seconds"] > 0 and m["repeats"] >= 3 for m in prof["measurements"])
    assert seen[-1][0] == seen[-1][1]  # progress reached the total


def test_device_strings_are_checked():
    assert parse_device("cpu") == ("cpu", None)
    assert parse_device("cuda:3") == ("cuda", 3)
    assert parse_device("cuda") == ("cuda", 0)
    for bad in ("tpu", "cpu:1", "cuda:x"):
        with pytest.raises(InvalidProfile) as exc:
            parse_device(bad)
        assert exc.value.field == "device"


def _cli() -> typer.Typer:
    from planner_service.cli import profile as cli_profile

    app = typer.Typer()
    cli_profile.register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    return app


def test_cli_profile_writes_a_fitted_profile(tiny_numpy_plan, tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(_cli(), ["profile", "--backend", "numpy", "--no-collectives", "--quick", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    validate_profile(prof)
    assert prof["fit"]["device"] == "local-cpu" and prof["fit"]["rates"]["gemm_tflops"]["fp32"] > 0


def test_cli_bad_input_exits_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(_cli(), ["profile", "--device", "tpu:0", "--no-collectives"])
    assert res.exit_code == 2 and "device" in res.output
    res = runner.invoke(_cli(), ["profile", "--backend", "jax"])
    assert res.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{\"traceEvents\": 5}")
    res = runner.invoke(_cli(), ["profile-trace", str(bad), "--device-name", "local-cpu"])
    assert res.exit_code == 2 and "traceEvents" in res.output
    res = runner.invoke(_cli(), ["profile-trace", str(tmp_path / "missing.json")])
    assert res.exit_code == 2


def test_cli_profile_trace(tmp_path):
    out = tmp_path / "t.json"
    res = CliRunner().invoke(_cli(), ["profile-trace", str(FIXTURE_TRACE), "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    assert prof["device"]["name"] == "H100-SXM5-80GB" and prof["source"] == "trace" and "fit" in prof


@pytest.mark.slow
def test_gloo_collectives_across_two_processes():
    pytest.importorskip("torch")
    from planner_service.profiling.collectives import run_collectives

    labels = []
    res = run_collectives(2, cuda=False, quick=True, threads_per_rank=1, progress=labels.append, sizes=(1 << 12, 1 << 24), timeout_s=120)
    assert {(m["op"], m["bytes"]) for m in res} == {(op, s) for op in ("allreduce", "allgather", "reduce_scatter", "sendrecv") for s in (1 << 12, 1 << 24)}
    assert all(m["backend"] == "gloo" and m["group_size"] == 2 and m["seconds"] > 0 for m in res)
    assert len(labels) == len(res)
    # moving 4096x more bytes takes longer (compared within this one run, not against a clock)
    ar = {m["bytes"]: m["seconds"] for m in res if m["op"] == "allreduce"}
    assert ar[1 << 24] > ar[1 << 12]


def test_cli_cuda_without_a_gpu_exits_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    res = CliRunner().invoke(_cli(), ["profile", "--device", "cuda:0", "--quick"])
    assert res.exit_code == 2 and "not available" in res.output


def test_concurrent_ranks_are_checked():
    with pytest.raises(InvalidProfile) as e:
        run_profile(ProfileOptions(concurrent=0, backends=("numpy",), collectives=False))
    assert e.value.field == "concurrent"
    from planner_service.profiling.fingerprint import cpu_count

    with pytest.raises(InvalidProfile) as e:
        run_profile(ProfileOptions(concurrent=cpu_count() + 1, threads=1, backends=("numpy",), collectives=False))
    assert e.value.field == "concurrent" and "exceed" in e.value.message


@pytest.mark.slow  # wall-clock sensitive: other processes on the host count as contention
@pytest.mark.skipif(__import__("os").cpu_count() < 2, reason="a neighbour rank needs a second core")
def test_concurrent_profile_runs_beside_a_neighbour_and_stops_it(tiny_numpy_plan, monkeypatch):
    """--concurrent 2 starts one neighbour process running the benchmarks, does not count it as
    contention (every contention monitor and every wait for a quiet host excludes its pid),
    records the setting, and leaves no process behind.  Checked by what the runner passes to the
    monitor, not by how long it waited: a busy host makes any time bound flaky."""
    from planner_service.profiling import runner

    started: list = []
    monitors: list[tuple[int, ...]] = []
    waits: list[tuple[int, ...]] = []
    real_start, real_monitor, real_wait = runner.start_neighbours, runner.HostMonitor, runner.wait_until_quiet

    def spy_start(*args):
        procs = real_start(*args)
        started.extend(procs)
        return procs

    def spy_monitor(own_pids=()):
        monitors.append(tuple(own_pids))
        return real_monitor(own_pids)

    def spy_wait(threshold, max_wait_s, own_pids=()):
        waits.append(tuple(own_pids))
        return real_wait(threshold, max_wait_s, own_pids=own_pids)

    told: list[int] = []
    real_follow = runner.follow

    def spy_follow(procs, index):
        told.append(index)
        return real_follow(procs, index)

    monkeypatch.setattr(runner, "follow", spy_follow)
    monkeypatch.setattr(runner, "start_neighbours", spy_start)
    monkeypatch.setattr(runner, "HostMonitor", spy_monitor)
    monkeypatch.setattr(runner, "wait_until_quiet", spy_wait)
    prof = run_profile(ProfileOptions(quick=True, backends=("numpy",), collectives=False, threads=1, concurrent=2, max_wait_s=5.0))
    validate_profile(prof)
    assert prof["settings"]["concurrent"] == 2
    assert len(started) == 1 and all(p.poll() is not None for p in started)  # stopped
    neighbour = started[0].pid
    assert monitors and all(neighbour in pids for pids in monitors)
    assert all(neighbour in pids for pids in waits)
    # the neighbour was told every case before it was timed, in order
    assert told and sorted(set(told)) == list(range(max(told) + 1)) and told[0] == 0


def test_a_neighbour_rank_runs_the_case_being_timed_until_told_another():
    """A neighbour runs, untimed, the case whose index the measuring process sent last — each
    operator timed beside copies of itself, as data-parallel ranks run it — setting a case up
    once per change, switching backends as the cases do, and stops when the pipe closes."""
    from planner_service.profiling.cases import Case
    from planner_service.profiling.neighbour import follow_cases, index_lines

    assert list(index_lines(["0\n", "2\n", "junk\n", "7\n", "1"], count=3)) == [0, 2, 1]
    ran: list[str] = []
    cases = [Case(label=name, fields={"backend": backend}, setup=lambda name=name: ((lambda: ran.append(name)), (lambda: None)))
             for name, backend in (("gemm", "torch"), ("copy", "torch"), ("np-gemm", "numpy"))]
    # the measuring process's messages, as read between two runs of a case
    told = iter([0, 0, 0, 2, 2, 1, None])
    switched: list[str | None] = []
    setups = follow_cases(cases, lambda: next(told), switched.append)
    assert ran == ["gemm", "gemm", "np-gemm"]  # "copy" set up, then the pipe closed
    assert setups == 3 and switched == ["torch", "numpy", "torch"]


@pytest.mark.slow  # wall-clock sensitive: the spinner's share of a core depends on the host's load
def test_host_monitor_does_not_count_its_own_processes():
    import subprocess
    import sys
    import time

    from planner_service.profiling.fingerprint import HostMonitor, _pids_cpu_s

    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    try:
        time.sleep(0.3)
        spin_cpu0_s = _pids_cpu_s((spin.pid,))
        own, other = HostMonitor((spin.pid,)), HostMonitor()
        time.sleep(1.0)
        counted_by_other, counted_by_own = other.others_busy_cores(), own.others_busy_cores()
        spin_cores = (_pids_cpu_s((spin.pid,)) - spin_cpu0_s) / other.elapsed_s()
        if spin_cores < 0.2:
            pytest.skip(f"the spinner got only {spin_cores:.2f} cores on this busy host")
        # Whatever else runs, the monitor told about the spinner leaves out exactly its share.
        assert counted_by_other - counted_by_own == pytest.approx(spin_cores, abs=0.15)
    finally:
        spin.kill()
        spin.wait()
