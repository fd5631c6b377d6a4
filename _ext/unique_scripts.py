"""Sphinx extension: each page lists each script once.

sphinx-thebe adds its inline configuration (``const THEBE_JS_URL = ...``) with ``add_js_file`` when the
environment reads its documents; under Jupyter Book 1 with Sphinx 7 the same inline script reaches
the page twice, and the second ``const`` declaration is a SyntaxError in the browser console of every
page (tests/test_web_book.py found it): one copy is registered with filename None, the other with
"", so Sphinx's own check does not see them as equal. This drops exact duplicates (same file or
same inline body, same attributes) from a page's script list, keeping the first.
"""


def _key(js):
    attributes = getattr(js, "attributes", {}) or {}
    # an inline script's filename is None or "" depending on who added it: both mean "no file"
    return str(getattr(js, "filename", js) or ""), tuple(sorted((k, str(v)) for k, v in attributes.items()))


def unique_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = _key(js)
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique  # in place: the page template reads this very list


def setup(app):
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
