"""verl_pipe.import_hooks: callbacks run right after the target module is imported, and never break the import."""

import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_callback_runs_after_import_and_at_once_when_already_imported():
    result = run_python(
        """
        import sys
        from verl_pipe.import_hooks import when_imported
        assert "xml.dom.minidom" not in sys.modules
        seen = []
        when_imported("xml.dom.minidom", lambda m: seen.append(hasattr(m, "parseString")))
        assert seen == []
        import xml.dom.minidom
        assert seen == [True], seen
        when_imported("xml.dom.minidom", lambda m: seen.append("again"))
        assert seen == [True, "again"], seen
        import inspect
        assert "def parseString" in inspect.getsource(xml.dom.minidom)  # the real loader stays visible
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_failing_callback_is_reported_and_the_import_still_works():
    result = run_python(
        """
        import logging
        logging.basicConfig()
        from verl_pipe.import_hooks import when_imported
        def broken(module):
            raise RuntimeError("boom")
        when_imported("xml.dom.minidom", broken)
        import xml.dom.minidom
        print(xml.dom.minidom.parseString("<a/>").documentElement.tagName)
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "a", result.stderr
    assert "setting up xml.dom.minidom after import failed: RuntimeError: boom" in result.stderr
