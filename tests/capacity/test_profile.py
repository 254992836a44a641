"""Memory and paging accounting of a multi-capacity model, and the per-level profile."""

import torch

from nestflex.capacity import MultiCapacityModel
from nestflex.capacity.profile import memory_report, paging_bytes, profile_levels, state_bytes, switching_table


def test_memory_paging_and_switching(vgg_roadmap):
    net, path = vgg_roadmap
    mc = MultiCapacityModel.from_roadmap(net, path, levels=3)
    mem = memory_report(mc.net)
    sizes = [state_bytes(mc.extract(k)) for k in range(3)]
    assert mem["independent_bytes"] == sum(sizes) and mem["level_bytes"] == sizes
    assert max(sizes) < mem["multi_capacity_bytes"] <= 1.05 * max(sizes)  # stored once (+ small per-level BN)
    pages = paging_bytes(mc.net)
    assert len(pages) == 6
    for (a, b), p in pages.items():
        assert p["page_in"] == pages[(b, a)]["page_out"]
        assert p["independent_page_in"] == sizes[b] and p["independent_page_out"] == sizes[a]
        # what stays resident is shared: b's bytes = page-in + (a's bytes - page-out)
        assert sizes[b] == p["page_in"] + sizes[a] - p["page_out"]
        if b > a:  # upgrade: pages out only a's own BatchNorm, far less than an independent switch
            bn_a = sum(t.numel() * t.element_size() for n, t in mc.net.state_dict().items() if f".levels.{a}." in n)
            assert p["page_out"] == bn_a and p["page_in"] < sizes[b]
    rows = switching_table(mc.net, repeats=1)
    assert {(r["from"], r["to"]) for r in rows} == set(pages) and all(r["nested_ms"] > 0 for r in rows)
    assert mc.level == 0


def test_profile_levels_grows_with_the_level(vgg_roadmap):
    net, path = vgg_roadmap
    mc = MultiCapacityModel.from_roadmap(net, path, levels=3)
    data = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))]
    rows = profile_levels(mc.net, data, batch_sizes=(1, 4), repeats=1)
    assert [r["level"] for r in rows] == [0, 1, 2]
    assert rows[0]["macs"] < rows[1]["macs"] < rows[2]["macs"] and rows[0]["memory_mb"] < rows[2]["memory_mb"]
    assert set(rows[0]["latency_ms"]) == {"1", "4"} and 0 <= rows[0]["accuracy"] <= 1
