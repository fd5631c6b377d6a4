"""scripts/execute_book.py: which chapters it executes, and that it stores them under the key the
Sphinx build looks up (myst-nb's reader, so the cache is hit and nothing runs twice)."""
import pytest

import execute_book  # scripts/, put on sys.path by conftest


def test_it_executes_every_toc_notebook_but_the_pages_with_their_own_execution_mode():
    chapters = {str(p.relative_to(execute_book.ROOT).with_suffix("")) for p in execute_book.executable_chapters()}
    assert {"book/lab", "book/advantages", "book/ppo"} <= chapters
    assert not chapters & {"reports/reproduction", "reports/papers", "reports/syllabus"}
    assert chapters <= set(execute_book.toc_stems())


def test_the_cache_key_is_myst_nbs(tmp_path):
    from jupyter_cache import get_cache
    from jupyter_cache.cache.main import CacheBundleIn

    path = execute_book.ROOT / "book" / "lab.md"
    nb, read_fmt = execute_book.read_notebook(path)
    assert read_fmt["name"] == "myst_nb_md" and any(c.cell_type == "code" for c in nb.cells)
    cache = get_cache(str(tmp_path / "cache"))
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nb)
    record = cache.add_nb_to_project(str(path), read_data=read_fmt)
    cache.cache_notebook_bundle(CacheBundleIn(nb, record.uri, data={"execution_seconds": 1.0}), check_validity=False)
    again, _ = execute_book.read_notebook(path)  # a second read, as the Sphinx build does
    assert cache.match_cache_notebook(again).data == {"execution_seconds": 1.0}


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        execute_book.main(["--jobs", "0"])
    with pytest.raises(SystemExit):
        execute_book.main(["--only", "book/no_such_chapter"])


def test_the_cache_holds_one_profiles_executions(tmp_path, capsys):
    cache = tmp_path / "cache"
    execute_book.cache_for_profile("smoke", cache)
    (cache / "executed.ipynb").write_text("{}")  # stands for a chapter executed in the smoke profile
    execute_book.cache_for_profile("smoke", cache)
    assert (cache / "executed.ipynb").exists()  # same profile: kept
    execute_book.cache_for_profile("book", cache)
    assert not (cache / "executed.ipynb").exists() and (cache / "PROFILE").read_text() == "book\n"
    assert "executed in the smoke profile; emptying it for the book profile" in capsys.readouterr().out
    (cache / "PROFILE").unlink()
    (cache / "old.ipynb").write_text("{}")  # a cache made before marks: not trusted
    execute_book.cache_for_profile("book", cache)
    assert not (cache / "old.ipynb").exists()
