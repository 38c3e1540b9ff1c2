"""Device memory in the train rows (bert_jax/train/throughput.device_memory)."""


class _Device:
  def __init__(self, stats):
    self._stats = stats

  def memory_stats(self):
    return self._stats


def test_device_memory_is_the_largest_use_and_peak_and_the_smallest_limit(monkeypatch):
  import jax
  from bert_jax.train import throughput
  gib = 1024**3
  monkeypatch.setattr(jax, "local_devices", lambda: [
      _Device({"bytes_in_use": 2 * gib, "peak_bytes_in_use": 5 * gib, "bytes_limit": 16 * gib}),
      _Device({"bytes_in_use": 3 * gib, "peak_bytes_in_use": 4 * gib, "bytes_limit": 15 * gib})])
  assert throughput.device_memory() == {"memory_in_use_gib": 3.0, "memory_peak_gib": 5.0,
                                        "memory_limit_gib": 15.0}


def test_a_platform_without_memory_stats_reports_none_and_says_so():
  from bert_jax.train import throughput
  assert throughput.device_memory() == {}  # the CPU devices of the tests
