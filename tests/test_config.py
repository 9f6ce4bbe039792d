"""The settings registry: defaults, overrides, type and key errors."""
from pathlib import Path

import pytest

from hisparse.config import (SCHEMA, config_from_dict, load_config, parse_overrides,
                             positive_integers)
from hisparse.errors import ConfigError

BASE = {"operation": {"name": "spmv"}, "input": {"path": "a.h5"}}


def test_defaults_fill_every_schema_key():
    cfg = config_from_dict(BASE, "t.yaml")
    assert cfg["run.repeats"] == SCHEMA["run"]["repeats"].default
    assert cfg["operation.params.format"] == "csr"
    assert cfg["backend"] == "auto" and cfg["precision"] == "fp64"


def test_overrides_parse_yaml_values_and_create_sections():
    pairs = parse_overrides(["run.repeats=7", "peers=[scipy]", "verify.rtol=1e-9",
                             "output.dir=/tmp/x"])
    cfg = config_from_dict(BASE, "t.yaml", pairs)
    assert cfg["run.repeats"] == 7 and cfg["peers"] == ["scipy"]
    assert cfg["verify.rtol"] == 1e-9 and cfg["output.dir"] == "/tmp/x"


@pytest.mark.parametrize("raw,key,needle", [
    ({"run": {"repeats": 0}}, "run.repeats", "must be positive"),
    ({"run": {"repeats": True}}, "run.repeats", "expected an integer"),
    ({"precision": "fp16"}, "precision", "expected one of 'fp64', 'fp32'"),
    ({"backend": "gpuu"}, "backend", "did you mean 'gpu'"),
    ({"operation": {"name": "spmvv"}}, "operation.name", "did you mean 'spmv'"),
    ({"operation": {"name": "spmv", "params": {"iterations": -1}}},
     "operation.params.iterations", "must be positive"),
    ({"partition": {"strategy": "random"}}, "partition.strategy", "expected one of"),
    ({"peers": ["mkl"]}, "peers[0]", "expected one of"),
    ({"outptu": {}}, "outptu", "did you mean 'output'"),
    ({"input": {"path": "a.h5", "generate": {"kind": "rmat"}}}, "input", "only one"),
])
def test_invalid_values_name_file_key_and_expectation(raw, key, needle):
    data = {**BASE, **raw}
    if "operation" in raw and "name" not in raw["operation"]:
        data["operation"] = {"name": "spmv", **raw["operation"]}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "conf.yaml")
    message = str(info.value)
    assert message.startswith("conf.yaml: ")
    assert f"'{key}'" in message and needle in message


def test_load_config_reports_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  name: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML: line"):
        load_config(bad)


def test_override_into_scalar_is_refused():
    with pytest.raises(ConfigError, match="cannot set"):
        config_from_dict({**BASE, "backend": "cpu"}, "t.yaml", parse_overrides(["backend.x=1"]))


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = config_from_dict(BASE, "t.yaml", parse_overrides(["run.name=abc"]))
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path).data == cfg.data


def test_duplicate_keys_are_refused_not_silently_dropped(tmp_path):
    """PyYAML keeps the last of two equal keys; a whole block the user wrote would vanish."""
    path = tmp_path / "dup.yaml"
    path.write_text("operation: {name: spmv}\ninput: {path: a.h5}\nrun:\n  repeats: 3\n"
                    "run:\n  warmup: 0\n")
    with pytest.raises(ConfigError, match=r"line 5, column 1: duplicate key 'run' \(first on "
                                          r"line 3\)"):
        load_config(path)
    with pytest.raises(ConfigError, match="duplicate key 'repeats'"):
        parse_overrides(["run={repeats: 2, repeats: 3}"])
    path.write_text("base: &b {name: spmv}\noperation:\n  <<: *b\n  name: spmv\n"
                    "input: {path: a.h5}\n")
    with pytest.raises(ConfigError, match="unknown key"):  # merges are allowed; 'base' is not
        load_config(path)


def test_a_config_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"run: {name: t}\n\x89HDF\r\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0x89 on line 2\)"):
        load_config(path)


SHIPPED_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "inputs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=[p.name for p in SHIPPED_CONFIGS])
def test_every_shipped_config_validates(path):
    """The benchmark and quickstart configs under inputs/ stay valid as the schema and the
    operations' parameters change (unknown keys, wrong types and unknown peers are errors)."""
    cfg = load_config(path)
    assert cfg["operation.name"] and cfg["run.repeats"] >= 1


def test_there_are_shipped_configs():
    assert len(SHIPPED_CONFIGS) > 10


def test_an_override_of_the_input_source_replaces_the_files_other_one():
    generated = {"operation": {"name": "spmv"},
                 "input": {"generate": {"kind": "poisson", "dims": [4, 4]}}}
    read = {"operation": {"name": "spmv"}, "input": {"path": "a.h5"}}
    config = config_from_dict(generated, "g.yaml", parse_overrides(["input.path=b.h5"]))
    assert config["input.path"] == "b.h5" and config["input.generate"] is None
    config = config_from_dict(read, "r.yaml", parse_overrides(["input.generate.kind=poisson",
                                                               "input.generate.dims=[3, 3]"]))
    assert config["input.path"] is None and config["input.generate"]["kind"] == "poisson"
    # A parameter of the generator changes it, the source stays
    config = config_from_dict(generated, "g.yaml", parse_overrides(["input.generate.dims=[5, 5]"]))
    assert config["input.generate"]["dims"] == [5, 5]
    # Both given on the command line: the usual error, naming the key
    with pytest.raises(ConfigError, match="only one of input.path and input.generate"):
        config_from_dict(read, "r.yaml", parse_overrides(["input.path=b.h5",
                                                          "input.generate.kind=poisson"]))
    # Clearing the one source leaves none: the error says what to give
    with pytest.raises(ConfigError, match="give either input.path"):
        config_from_dict(generated, "g.yaml", parse_overrides(["input.generate=null"]))


@pytest.mark.parametrize("raw,key,needle", [
    ({"run": {"repeats": 10 ** 23}}, "run.repeats", "does not fit in a 64-bit integer"),
    ({"run": {"repeats": 10 ** 10}}, "run.repeats", "must be at most 1,000,000,000"),
    ({"run": {"warmup": 10 ** 10}}, "run.warmup", "must be at most 1,000,000,000"),
    ({"operation": {"name": "spmv", "params": {"iterations": 2 ** 64}}},
     "operation.params.iterations", "does not fit in a 64-bit integer"),
    ({"run": {"seed": -2 ** 70}}, "run.seed", "does not fit in a 64-bit integer"),
])
def test_absurd_counts_are_refused_by_key(raw, key, needle):
    merged = {**BASE, **raw}
    if "operation" in raw:
        merged["operation"] = raw["operation"]
    with pytest.raises(ConfigError) as info:
        config_from_dict(merged, "t.yaml")
    assert info.value.key == key and needle in str(info.value), str(info.value)


def test_large_but_sane_counts_are_accepted():
    """An iteration count of 1e14 is accepted (a long run stops on its walltime signal); the
    repeats' bound itself is accepted."""
    cfg = config_from_dict({**BASE, "run": {"repeats": 10 ** 9, "warmup": 10 ** 9},
                            "operation": {"name": "spmv", "params": {"iterations": 10 ** 14}}},
                           "t.yaml")
    assert cfg["run.repeats"] == 10 ** 9 and cfg["operation.params.iterations"] == 10 ** 14


@pytest.mark.parametrize("value,ok", [([3, 4, 5], True), ([1], True), ([], False),
                                      (None, False), ([3, 0], False), ([3, -2], False),
                                      ([True, 2], False), ([2.0, 3], False)])
def test_positive_integers_takes_a_shape_only(value, ok):
    """The one check of a shape (a tensor's dims, Cholesky's ordering_grid): every entry an int
    above 0 (not a bool, not a float), at least one."""
    assert (positive_integers(value) is None) == ok
