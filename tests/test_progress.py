"""A long run is never silent for long: rank 0 says when the read, the setup (and Cholesky's
analysis) and the repeats took over ``context.PROGRESS_SECONDS``; ``run.progress: false`` keeps
it quiet."""
import pytest

from hisparse import context, driver

from helpers import results_in, write_config


@pytest.mark.parametrize("progress", [True, False])
def test_steps_longer_than_the_threshold_say_so(tmp_path, monkeypatch, capsys, progress):
    # every step counts as long
    monkeypatch.setattr(context, "PROGRESS_SECONDS", -1.0)
    cfg = write_config(tmp_path, "cholesky", {"ordering": "rcm"}, backend="cpu", peers=[],
                       run={"repeats": 2, "warmup": 0, "progress": progress},
                       input={"generate": {"kind": "poisson", "dims": [6, 5, 4]}})
    driver.run(str(cfg))
    results_in(tmp_path / "out")
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("hisparse: ")]
    said = {prefix: [line for line in lines if line.startswith("hisparse: " + prefix)]
            for prefix in ("read (", "cholesky: analysis ", "set up (", "repeat ")}
    if progress:
        assert len(said["read ("]) == len(said["set up ("]) == 1, lines
        assert "(ordering " in said["cholesky: analysis "][0]
        assert ", computed; symbolic " in said["cholesky: analysis "][0]
        assert [line.split(" (")[0] for line in said["repeat "]] == [
            "hisparse: repeat 1/2", "hisparse: repeat 2/2"]
        # in order: read, analysis (inside the setup), setup, repeats
        order = [lines.index(said[p][0]) for p in said]
        assert order == sorted(order)
    else:
        assert not any(said.values()), lines
