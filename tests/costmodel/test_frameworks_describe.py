"""cost_model.frameworks.describe: the page's one-line hint per framework, read off the rules."""

import pytest

from cost_model.frameworks import RULES, describe


@pytest.mark.parametrize("framework", sorted(RULES))
def test_each_framework_is_described_by_its_own_rules(framework):
    r = RULES[framework]
    text = describe(framework)
    assert text.startswith(r.title + ":")
    assert all(f"{z} {r.sharding_name[z]}" in text for z in r.zero_stages)  # every sharding stage it has, by its name
    assert ("no tp" in text) == (not r.tensor_parallel)
    assert ("pp with interleaving" in text) == r.interleaved_pipeline
    assert ("no dp_shard" in text) == (not r.partial_sharding_stages)
    assert ("no FP8" in text) == (not r.fp8)
    # what it can offload to the host, and the 8-bit AdamW where its trainers run one
    assert ("activations" in text) == bool(r.activation_offloading) and ("sharded state" in text) == bool(r.cpu_offload)
    assert ("optimizer state" in text) == bool(r.optimizer_offload) and ("8-bit AdamW" in text) == bool(r.eight_bit_adam)
    assert ("Muon" in text) == bool(r.muon)


def test_what_differs_between_frameworks_shows():
    assert "no tp" in describe("deepspeed") and "no tp" not in describe("megatron-deepspeed")
    assert "HSDP" in describe("fsdp") and "(2–3 also with pp)" in describe("fsdp")
    assert "ep folded into tp·cp·dp" in describe("megatron-core")
