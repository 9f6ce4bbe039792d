"""Docs that run: every fenced command and snippet of README.md, docs/*.md, docs/ops/*.md and
docs/scaling/*.md is executed here, or marked as needing what CI lacks and checked for the files
it names. The config reference in docs/ is generated from the schemas and must not drift.

A block is marked by an HTML comment on the line right before its fence::

    <!-- needs: gpu -->          a GPU (benchmarks)
    <!-- needs: cluster -->      a scheduler or several nodes (job scripts, srun, sbatch)
    <!-- needs: network -->      an installation from the package index
    <!-- needs: data -->         inputs a checkout does not hold (downloaded matrices)

(several: ``<!-- needs: gpu, data -->``). A marked block is not run; every repository path it
names (``inputs/...``, ``jobs/...``, ``docs/...``) must exist, and every config it gives to
``hisparse run`` or ``hisparse jobs`` must load. An unmarked block runs:

- ``bash``: each command, in a scratch directory whose ``inputs`` is the repository's (relative
  paths resolve as in a checkout), one directory per document so that later commands see what
  earlier ones wrote; ``hisparse ...`` and ``mpiexec -n N hisparse ...`` only (anything else
  must be marked). The user's own files the docs name (``matrix.mtx.gz``) are made small here.
- ``python``: the document's snippets one after another in one namespace, in a directory holding
  a 1- and 2-rank strong study of the quickstart in ``results/qs`` (with the report's CSV files);
  ``path`` is a results file of it, as the prose of the docs calls one.
- ``yaml``: parsed; a run config (it has ``operation``) is validated.

Unlabelled fences and ``text`` are diagrams or file excerpts: not run.
"""
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from conftest import MPI_TIMEOUT, ROOT, mpi_env, mpiexec_command

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "docs" / "ops").glob("*.md"), *(ROOT / "docs" / "scaling").glob("*.md")])
NEEDS = {"gpu", "cluster", "network", "data"}
_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_MARK = re.compile(r"^<!--\s*needs:\s*([\w ,-]+?)\s*-->\s*$")
#: Repository paths as commands and snippets name them.
_REPO_PATH = re.compile(r"(?<![\w./$<{-])((?:inputs|docs|jobs|tests|app|kernels_cu|\.ci)/"
                        r"[\w.\-/]*[\w])")


class Block:
    def __init__(self, doc, line, lang, text, needs):
        self.doc, self.line, self.lang, self.text, self.needs = doc, line, lang, text, needs

    def __repr__(self):
        return f"{self.doc.relative_to(ROOT)}:{self.line} ({self.lang or 'no language'})"


def blocks(doc):
    """The fenced blocks of ``doc`` with their language and markers."""
    lines = doc.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match.group(1).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{doc}:{start + 1}: fence never closed"
        previous = lines[start - 1].strip() if start else ""
        mark = _MARK.match(previous)
        needs = {n.strip() for n in mark.group(1).split(",")} if mark else set()
        out.append(Block(doc, start + 1, lang, "\n".join(lines[start + 1:end]), needs))
        i = end + 1
    return out


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]


def commands(text):
    """The logical command lines of a shell block, continuation lines joined, as argv lists
    (comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def _hisparse_argv(argv):
    """``argv`` as a runnable command list, or None when it is not a hisparse command (bare or
    under ``mpiexec -n N``)."""
    if argv[0] == "hisparse":
        return [sys.executable, "-m", "hisparse", *argv[1:]]
    if argv[0] in ("mpiexec", "mpirun") and len(argv) > 3 and argv[1] == "-n" \
            and argv[3] == "hisparse":
        launcher = mpiexec_command()
        if launcher is None:
            pytest.skip("mpiexec not found")
        return launcher + ["-n", argv[2], sys.executable, "-m", "hisparse", *argv[4:]]
    return None


def test_config_reference_matches_the_schemas():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_config_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_markers_are_known_and_unmarked_shell_blocks_hold_only_hisparse_commands():
    problems = []
    for block in ALL_BLOCKS:
        unknown = block.needs - NEEDS
        if unknown:
            problems.append(f"{block}: unknown marker(s) {sorted(unknown)}; use {sorted(NEEDS)}")
        if block.lang in ("bash", "sh", "shell", "console") and not block.needs:
            for argv in commands(block.text):
                if argv[0] not in ("hisparse", "mpiexec", "mpirun") or \
                        (argv[0] != "hisparse" and "hisparse" not in argv[:5]):
                    problems.append(f"{block}: `{' '.join(argv)[:60]}` cannot run in CI: mark "
                                    f"the block <!-- needs: ... -->")
        if block.lang == "" and re.search(r"^\s*(hisparse|mpiexec|mpirun|srun) ", block.text,
                                          re.M):
            problems.append(f"{block}: commands in a fence without a language: say bash")
    assert not problems, "\n".join(problems)


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for block in ALL_BLOCKS:
        if block.lang in ("", "text"):
            continue
        for path in _REPO_PATH.findall(block.text):
            if not (ROOT / path).exists():
                missing.append(f"{block}: {path}")
    assert not missing, "files named by the docs that a checkout does not have:\n" + \
        "\n".join(missing)


def _config_arguments(argv):
    """``(config path, --set overrides)`` of a ``hisparse run`` / ``hisparse jobs`` command."""
    if "hisparse" not in argv:
        return None
    rest = argv[argv.index("hisparse") + 1:]
    if len(rest) < 2 or rest[0] not in ("run", "jobs") or not rest[1].endswith(".yaml"):
        return None
    overrides = [rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--set"]
    return rest[1], overrides


def test_configs_of_marked_commands_load():
    """A GPU benchmark or a cluster job cannot run here, but its config must load as written
    (with its --set values): a renamed key or a missing file fails here, not on the cluster.
    A config that reads a file a checkout lacks (``data/...``) is marked ``data``."""
    from hisparse.config import load_config, parse_overrides
    problems = []
    for block in ALL_BLOCKS:
        if not block.needs or block.lang not in ("bash", "sh", "shell"):
            continue
        for argv in commands(block.text):
            found = _config_arguments(argv)
            if found is None or not found[0].startswith("inputs/"):
                continue
            path, overrides = found
            try:
                config = load_config(ROOT / path, parse_overrides(overrides))
            except Exception as exc:  # noqa: BLE001 - every failure is a doc problem
                problems.append(f"{block}: {' '.join(argv)[:70]}: {exc}")
                continue
            source = config["input.path"]
            if source and not (ROOT / source).exists() and "data" not in block.needs:
                problems.append(f"{block}: {path} reads {source}, which a checkout does not "
                                f"have: mark the block <!-- needs: ..., data -->")
    assert not problems, "\n".join(problems)


def test_yaml_blocks_parse_and_run_configs_validate():
    from hisparse.config import config_from_dict
    for block in ALL_BLOCKS:
        if block.lang not in ("yaml", "yml") or block.needs:
            continue
        data = yaml.safe_load(block.text)
        assert isinstance(data, dict), block
        if "operation" in data:
            config_from_dict(data, source=repr(block))


def _scratch(tmp_path):
    """A directory that looks like a checkout to relative paths (``inputs`` is the
    repository's), with the user's own files the docs name, made small."""
    import gzip

    import scipy.io
    import scipy.sparse as sp
    (tmp_path / "inputs").symlink_to(ROOT / "inputs")
    matrix = sp.random(50, 50, density=0.1, format="coo", random_state=1) + sp.eye(50)
    with gzip.open(tmp_path / "matrix.mtx.gz", "wb") as handle:
        scipy.io.mmwrite(handle, sp.coo_matrix(matrix))
    return tmp_path


SHELL_DOCS = [doc for doc in DOCS if any(b.lang in ("bash", "sh", "shell") and not b.needs
                                         for b in blocks(doc))]


@pytest.mark.parametrize("doc", SHELL_DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_shell_commands_run(doc, tmp_path):
    work = _scratch(tmp_path)
    for block in blocks(doc):
        if block.lang not in ("bash", "sh", "shell") or block.needs:
            continue
        for argv in commands(block.text):
            command = _hisparse_argv(argv)
            assert command is not None, f"{block}: {argv}"
            proc = subprocess.run(command, capture_output=True, text=True, cwd=work,
                                  timeout=MPI_TIMEOUT, env=dict(mpi_env(), HISPARSE_DOCS_TEST="1"))
            assert proc.returncode == 0, \
                f"{block}: `{' '.join(argv)}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def quickstart_study(tmp_path_factory):
    """``results/qs``: the quickstart at 1 and 2 ranks as a strong study (CPU), and the report's
    files, in a directory that looks like a checkout."""
    work = _scratch(tmp_path_factory.mktemp("study"))
    for nprocs in (1, 2):
        argv = ["hisparse", "run", "inputs/quickstart.yaml", "--quiet", "--set", "backend=cpu",
                "--set", "run.study=strong", "--set", "run.study_id=qs",
                "--set", "output.dir=results/qs", "--set", "run.repeats=3"]
        if nprocs > 1:
            argv = ["mpiexec", "-n", str(nprocs)] + argv
        proc = subprocess.run(_hisparse_argv(argv), capture_output=True, text=True, cwd=work,
                              timeout=MPI_TIMEOUT, env=mpi_env())
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(_hisparse_argv(["hisparse", "report", "results/qs", "--output",
                                          "results/qs", "--no-plots"]),
                          capture_output=True, text=True, cwd=work, timeout=MPI_TIMEOUT,
                          env=mpi_env())
    assert proc.returncode == 0, proc.stderr
    return work


PYTHON_DOCS = [doc for doc in DOCS if any(b.lang == "python" and not b.needs
                                          for b in blocks(doc))]


@pytest.mark.parametrize("doc", PYTHON_DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_python_snippets_run(doc, quickstart_study, monkeypatch):
    monkeypatch.chdir(quickstart_study)
    results = sorted(str(p.relative_to(quickstart_study))
                     for p in (quickstart_study / "results" / "qs").glob("*__r2__*.h5"))
    namespace = {"__name__": "__docs__", "path": results[0]}
    for block in blocks(doc):
        if block.lang != "python" or block.needs:
            continue
        try:
            exec(compile(block.text, repr(block), "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"{block} raised {type(exc).__name__}: {exc}") from exc


def test_the_block_reader_sees_markers_and_languages(tmp_path):
    """The reader itself, on a document written here."""
    doc = tmp_path / "x.md"
    doc.write_text("text\n<!-- needs: gpu, data -->\n```bash\nhisparse run a.yaml \\\n"
                   "    --set x=1  # comment\n```\n\n```python\nprint(1)\n```\n")
    found = blocks(doc)
    assert [(b.lang, b.needs, b.line) for b in found] == [("bash", {"gpu", "data"}, 3),
                                                         ("python", set(), 8)]
    assert commands(found[0].text) == [["hisparse", "run", "a.yaml", "--set", "x=1"]]
    assert _config_arguments(commands(found[0].text)[0]) == ("a.yaml", ["x=1"])
