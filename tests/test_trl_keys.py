"""rlscale's own arithmetic on a user's GRPOConfig keys (planner/frameworks/trl.py), which runs before TRL's parser:
a batch key that is not a positive whole number is a UserError naming the key, never a crash."""

import pytest
from rlscale.planner.frameworks.trl import accumulation_keeping_updates, recipe_from_keys, updates_per_generated_batch

from rlscale.base.errors import UserError

BAD = [
    ("per_device_train_batch_size", 0),
    ("per_device_train_batch_size", "abc"),
    ("per_device_train_batch_size", [8]),
    ("per_device_train_batch_size", True),
    ("gradient_accumulation_steps", 0),
    ("gradient_accumulation_steps", -2),
    ("generation_batch_size", "abc"),
    ("steps_per_generation", 0),
    ("num_generations", "abc"),
    ("num_iterations", 0),
]


@pytest.mark.parametrize("key, value", BAD + [("max_steps", "abc"), ("max_steps", [1]), ("max_steps", 1.5)])
def test_a_key_rlscale_counts_with_that_is_not_a_whole_number_is_a_user_error_naming_it(key, value):
    for read in (recipe_from_keys, updates_per_generated_batch):
        with pytest.raises(UserError) as raised:
            read({key: value})
        assert raised.value.field == key and repr(value) in str(raised.value)
    with pytest.raises(UserError):
        accumulation_keeping_updates({key: value}, {"generation_batch_size": 16})


def test_good_keys_give_trls_arithmetic():
    # 16 completions per device x 4 accumulation steps: one 64-completion update, twice over 2 iterations
    keys = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "num_generations": 8}
    assert recipe_from_keys(keys)["prompts_per_batch"] == 64 // 8
    assert updates_per_generated_batch({**keys, "num_iterations": 2}) == 2
    assert recipe_from_keys({"max_steps": -1}).get("max_steps") is None  # TRL's -1: not set
    assert updates_per_generated_batch({"per_device_train_batch_size": None}) == 1  # null: TRL's default
