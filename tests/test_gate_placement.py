"""gate.placement: topology from sysfs, default masks, user overrides, server knobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gate.run.placement import Placement, default_placement, parse_placement, resolve_placement
from gate.run.topology import CpuInfo, format_cpu_list, read_local_cpus, read_topology
from resident.config import parse_cpu_list


def fake_sysfs(root: Path, cores: list[list[int]], packages: list[int] | None = None) -> Path:
    """A sysfs cpu tree: `cores[i]` lists the hyperthreads of core i (on `packages[i]`)."""
    for index, threads in enumerate(cores):
        package = packages[index] if packages else 0
        for cpu in threads:
            topology = root / f"cpu{cpu}" / "topology"
            topology.mkdir(parents=True)
            (topology / "core_id").write_text(f"{index}\n")
            (topology / "physical_package_id").write_text(f"{package}\n")
            (topology / "thread_siblings_list").write_text(format_cpu_list(threads) + "\n")
    return root


def ht_host(tmp_path: Path) -> list[CpuInfo]:
    """8 CPUs, 4 cores, siblings (0,4), (1,5), (2,6), (3,7)."""
    sysfs = fake_sysfs(tmp_path, [[0, 4], [1, 5], [2, 6], [3, 7]])
    return read_topology(sysfs, allowed=range(8))


def siblings_of(cpus: list[CpuInfo]) -> dict[int, tuple[int, ...]]:
    return {info.cpu: info.siblings for info in cpus}


def test_format_cpu_list_round_trips_through_parse_cpu_list():
    assert format_cpu_list([8, 0, 1, 2, 3]) == "0-3,8"
    assert format_cpu_list([5, 4, 7]) == "4-5,7"
    assert format_cpu_list([]) == ""
    cpus = [0, 2, 3, 4, 9, 10, 12]
    assert parse_cpu_list(format_cpu_list(cpus), "x") == cpus


def test_topology_reads_cores_packages_and_siblings(tmp_path):
    cpus = ht_host(tmp_path)
    assert [info.cpu for info in cpus] == list(range(8))
    assert cpus[0] == CpuInfo(cpu=0, core=0, package=0, siblings=(0, 4))
    assert cpus[5] == CpuInfo(cpu=5, core=1, package=0, siblings=(1, 5))


def test_topology_without_files_makes_each_cpu_its_own_core(tmp_path):
    cpus = read_topology(tmp_path, allowed=[0, 1, 2])
    assert cpus == [CpuInfo(cpu, cpu, 0, (cpu,)) for cpu in range(3)]


def test_topology_without_sibling_lists_groups_by_core_id(tmp_path):
    fake_sysfs(tmp_path, [[0, 2], [1, 3]])
    for cpu in range(4):
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").unlink()
    assert siblings_of(read_topology(tmp_path, allowed=range(4))) == {
        0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}


def test_topology_of_this_machine_reads():
    cpus = read_topology()
    assert {info.cpu for info in cpus} == os.sched_getaffinity(0)
    for info in cpus:
        assert info.cpu in info.siblings
    assert default_placement(cpus, None).server_cpus


def test_default_keeps_siblings_together_and_the_client_apart(tmp_path):
    placement = default_placement(ht_host(tmp_path), gpu=0)
    assert placement.client_cpus == (3, 7)  # the last of 4 cores, both hyperthreads
    assert placement.server_cpus == (0, 1, 2, 4, 5, 6)
    assert placement.api_core == 0
    assert placement.step_cores == (1, 2, 4, 5, 6)
    assert placement.gpu == 0
    assert not placement.overlap
    assert not set(placement.server_cpus) & set(placement.client_cpus)
    for cpu in placement.client_cpus:
        assert {4 + cpu % 4, cpu % 4} <= set(placement.client_cpus)


def test_default_takes_about_a_quarter_of_the_cores_for_the_client(tmp_path):
    sysfs = fake_sysfs(tmp_path, [[cpu] for cpu in range(16)])
    placement = default_placement(read_topology(sysfs, allowed=range(16)), gpu=None)
    assert placement.client_cpus == (12, 13, 14, 15)
    assert placement.server_cpus == tuple(range(12))


def test_default_keeps_the_server_on_one_package(tmp_path):
    cores = [[cpu, cpu + 8] for cpu in range(8)]
    sysfs = fake_sysfs(tmp_path, cores, packages=[0, 0, 0, 0, 1, 1, 1, 1])
    cpus = read_topology(sysfs, allowed=range(16))
    placement = default_placement(cpus, gpu=0)
    assert placement.server_cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert placement.client_cpus == (6, 7, 14, 15)
    assert any("package 0" in note for note in placement.notes)
    assert any("4-5,12-13" in note for note in placement.notes)  # idle CPUs named
    local = default_placement(cpus, gpu=0, local_cpus=range(4, 8))
    assert local.server_cpus == (4, 5, 6, 7, 12, 13, 14, 15)
    assert local.client_cpus == (2, 3, 10, 11)
    assert any("local to the GPU" in note for note in local.notes)


def test_fewer_than_four_cpus_give_the_step_threads_a_cpu_of_their_own(tmp_path):
    cpus = read_topology(tmp_path, allowed=[0, 1])
    placement = default_placement(cpus, gpu=None)
    assert placement.server_cpus == (0, 1)
    assert (placement.api_core, placement.step_cores, placement.client_cpus) == (0, (1,), (0,))
    assert placement.overlap  # the client shares the API process's CPU
    assert placement.server_knobs() == {"api_core": "0", "step_thread_cores": "1"}
    assert placement.notes == ("fewer than 4 CPUs (2): step threads alone on CPUs 1, the API "
                               "process and the client share CPU 0",)
    alone = default_placement(read_topology(tmp_path, allowed=[3]), gpu=None)
    assert (alone.server_cpus, alone.step_cores, alone.api_core, alone.client_cpus) == (
        (3,), (), None, (3,))


def test_server_knobs_use_the_cpu_list_syntax(tmp_path):
    placement = Placement(server_cpus=(3, 4, 5, 6), step_cores=(4, 5, 6), api_core=3,
                          client_cpus=(7,), gpu=0, overlap=False)
    knobs = placement.server_knobs()
    assert knobs == {"api_core": "3", "step_thread_cores": "4-6"}
    assert parse_cpu_list(knobs["step_thread_cores"], "step_thread_cores") == [4, 5, 6]
    unsplit = Placement((0, 1), (), None, (0, 1), None, True)
    assert unsplit.server_knobs() == {}


def test_to_dict_is_json_and_round_trips(tmp_path):
    placement = default_placement(ht_host(tmp_path), gpu=0)
    data = json.loads(json.dumps(placement.to_dict()))
    assert data["server_cpus"] == [0, 1, 2, 4, 5, 6]
    assert data["masks"] == {"server": "0-2,4-6", "step": "1-2,4-6", "client": "3,7"}
    assert Placement.from_dict(data) == placement


def parse(allowed=range(8), **options) -> object:
    names = ("server_cpus", "step_cores", "api_core", "client_cpus", "gpu")
    return parse_placement(*(options.get(name) for name in names), allowed=set(allowed))


def test_overrides_replace_the_defaults_and_recompute_overlap(tmp_path):
    default = default_placement(ht_host(tmp_path), gpu=0)
    assert resolve_placement(default, parse()) == default
    assert resolve_placement(default, parse(server_cpus="", gpu=" ")) == default
    placement = resolve_placement(default, parse(server_cpus="0-3", client_cpus="4-7", gpu="1"))
    assert placement.server_cpus == (0, 1, 2, 3)
    assert (placement.api_core, placement.step_cores) == (0, (1, 2, 3))
    assert placement.client_cpus == (4, 5, 6, 7)
    assert placement.gpu == 1
    assert not placement.overlap
    assert "overridden: --server-cpus 0-3, --client-cpus 4-7, --gpu 1" in placement.notes
    shared = resolve_placement(default, parse(client_cpus="2-3"))
    assert shared.overlap
    assert any("share CPUs 2" in note for note in shared.notes)


def test_api_core_and_step_core_overrides(tmp_path):
    default = default_placement(ht_host(tmp_path), gpu=0)
    api = resolve_placement(default, parse(api_core="5"))
    assert (api.api_core, api.step_cores) == (5, (0, 1, 2, 4, 6))
    step = resolve_placement(default, parse(server_cpus="0-3", step_cores="2-3"))
    assert (step.api_core, step.step_cores) == (0, (2, 3))
    assert step.server_knobs() == {"api_core": "0", "step_thread_cores": "2-3"}
    one = resolve_placement(default, parse(server_cpus="2"))
    assert (one.api_core, one.step_cores) == (None, ())


@pytest.mark.parametrize("options, message", [
    ({"step_cores": "7", "server_cpus": "0-3"},
     "--step-cores 7: CPU 7 is not in --server-cpus 0-3"),
    ({"step_cores": "1,3"}, "--step-cores 1,3: CPU 3 is not in the server CPUs 0-2,4-6 (default)"),
    ({"api_core": "6", "server_cpus": "0-3"}, "--api-core 6: CPU 6 is not in --server-cpus 0-3"),
])
def test_overrides_outside_the_server_fail_naming_the_option(tmp_path, options, message):
    default = default_placement(ht_host(tmp_path), gpu=0)
    with pytest.raises(ValueError) as error:
        resolve_placement(default, parse(**options))
    assert str(error.value) == message


@pytest.mark.parametrize("options, message", [
    ({"server_cpus": "0-9"}, "--server-cpus 0-9: CPU 8-9 is not allowed for this process"),
    ({"client_cpus": "12"}, "--client-cpus 12: CPU 12 is not allowed"),
    ({"step_cores": "a-b"}, "--step-cores a-b: not a CPU list like 0-3,8"),
    ({"server_cpus": ","}, "--server-cpus ,: names no CPU"),
    ({"api_core": "1-2"}, "--api-core 1-2: give one CPU"),
    ({"gpu": "x"}, "--gpu x: not a GPU index"),
    ({"gpu": "-1"}, "--gpu -1: not a GPU index"),
])
def test_bad_options_fail_naming_the_option_and_value(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse(**options)


def test_local_cpus_of_a_pci_device(tmp_path):
    device = tmp_path / "0000:18:00.0"
    device.mkdir()
    (device / "local_cpulist").write_text("0-3,8\n")
    assert read_local_cpus("00000000:18:00.0", tmp_path) == {0, 1, 2, 3, 8}
    assert read_local_cpus("00000000:19:00.0", tmp_path) is None
