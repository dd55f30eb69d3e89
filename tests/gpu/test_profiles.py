import pytest

from gpuslice.gpu import ConfigError, compute_milli, parse_mig_profile, profile_memory_gb
from gpuslice.gpu.profiles import profile_name


@pytest.mark.parametrize(
    "name, expected",
    [("1g.10gb", (1, 10)), ("3g.40gb", (3, 40)), ("7g.141gb", (7, 141)), ("1g.10gb+me", (1, 10))],
)
def test_parse_valid(name, expected):
    assert parse_mig_profile(name) == expected


@pytest.mark.parametrize("name", ["9g.5gb", "5g.40gb", "1g", "1g.0gb", "3g40gb", "", 3, None])
def test_parse_invalid(name):
    with pytest.raises(ConfigError, match=r"is not a MIG profile name like '1g\.10gb'"):
        parse_mig_profile(name)


@pytest.mark.parametrize(
    "instance_mib, gpu_mib, gb",
    [
        (4864, 40960, 5),  # A100-40GB 1g.5gb
        (19968, 40960, 20),  # A100-40GB 3g.20gb
        (40192, 40960, 40),  # A100-40GB 7g.40gb
        (9856, 81920, 10),  # A100-80GB 1g.10gb
        (19968, 81920, 20),  # A100-80GB 2g.20gb / 1g.20gb
        (80896, 81920, 80),  # A100-80GB 7g.80gb: 79 GiB, still named 80gb
        (16384, 143771, 18),  # H200 1g.18gb
        (69888, 143771, 71),  # H200 3g.71gb (70.5 rounds up)
    ],
)
def test_profile_memory_matches_nvidia_names(instance_mib, gpu_mib, gb):
    assert profile_memory_gb(instance_mib, gpu_mib) == gb


def test_milli_and_names():
    assert compute_milli(1) == 142
    assert compute_milli(3) == 428
    assert compute_milli(7) == 1000
    assert compute_milli(1, total_slices=4) == 250
    assert profile_name(3, 40) == "3g.40gb"
    assert profile_name(3, 40, ci_slices=1) == "1c.3g.40gb"
    assert profile_name(3, 40, ci_slices=3) == "3g.40gb"
