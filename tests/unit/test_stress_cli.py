"""``python -m stress``: bad arguments and a database it cannot reach end in one line and
exit 2, not a traceback from deep inside a run."""

from __future__ import annotations

import pytest

from stress.__main__ import main


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_count_below_one_or_not_a_number_is_refused(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench-bare", "--jobs", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m stress bench-bare: error: argument --jobs:")


def test_an_unreachable_database_is_one_line_and_exit_2(capsys):
    url = "postgresql://nobody@127.0.0.1:1/none"  # port 1: refused at once
    code = main(["bench-bare", "--engine", "postgres", "--postgres-url", url, "--jobs", "10"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m stress bench-bare: database unavailable:")
