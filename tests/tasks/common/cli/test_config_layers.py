"""The keys of the config layers and where they are set: a key written with its ``init_args``
level and the same key written without it are one key, to the error that names its line and to
the refusal of an option a later ``--config`` sets again."""
from __future__ import annotations

import pytest

from rescale_tasks.common.cli.config_layers import key_location, refuse_lost_overrides
from rescale_tasks.common.errors import UserError

SPELLINGS = {"with init_args": "trainer:\n  max_epochs: 1\nmodel:\n  class_path: M\n  init_args:\n    depth: 8\n"
                               "    scheme: bn\n",
             "without init_args": "trainer:\n  max_epochs: 1\nmodel:\n  class_path: M\n  depth: 8\n\n"
                                  "  scheme: bn\n"}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("key", ["model.init_args.scheme", "model.scheme"])
def test_a_key_with_or_without_init_args_is_found_on_its_line(tmp_path, spelling, key):
    run = tmp_path / "run.yaml"
    run.write_text(SPELLINGS[spelling])
    assert key_location(key, [str(run)]) == f"{run}:7"
    assert key_location("model", [str(run)]) == f"{run}:3"  # a section: the line of its key
    with pytest.raises(UserError, match=rf"^--{key} comes before --config {run}, whose line 7 sets it again"):
        refuse_lost_overrides(["fit", f"--{key}", "gn", "--config", str(run)])
    refuse_lost_overrides(["fit", f"--{key.replace('scheme', 'width')}", "2", "--config", str(run)])
