"""Bench statistics as plain values: nearest-rank percentiles over exact sorted samples."""

from testbed.bench.figures import figures, percentile


def test_percentile_is_nearest_rank_without_interpolation() -> None:
    s = [float(i) for i in range(1, 101)]
    assert percentile(s, 50) == 50.0
    assert percentile(s, 95) == 95.0
    assert percentile(s, 99) == 99.0
    assert percentile([7.0], 95) == 7.0


def test_figures_report_ms_and_per_message_cpu() -> None:
    f = figures([0.001, 0.002, 0.003, 0.004], wall_s=0.02, receiver_cpu_s=[0.004, 0.008], sender_cpu_s=0.004)
    assert f.p50_ms == 2.0 and f.max_ms == 4.0
    assert f.throughput_msg_s == 200.0
    assert f.cpu_ms_per_msg_receivers == [1.0, 2.0]
    assert f.cpu_ms_per_msg_per_receiver == 1.5
    assert f.cpu_ms_per_msg_sender == 1.0
