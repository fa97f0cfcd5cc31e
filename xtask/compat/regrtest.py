# regrtest (python3 -m test), with one fix, for `cargo xtask compat`, bare and in the
# sandbox alike. With --junit-xml, regrtest's result captures each test's output
# (`buffer`), and reads it back from sys.stdout and sys.stderr. A test that swaps those
# from another thread meanwhile (test_socket's threaded tests, when their setUp fails)
# crashes the whole module's run with "AttributeError: ... no attribute 'getvalue'", and
# the report holds no test at all (a CPython bug). Here the captured output is read from
# the capture buffers themselves.
import sys, unittest.result as r
exc_info_to_string = r.TestResult._exc_info_to_string
def captured(self):
    return [b.getvalue() for b in (self._stdout_buffer, self._stderr_buffer) if b is not None]
def safe_exc_info_to_string(self, err, test):
    buffered, self.buffer = self.buffer, False
    try:
        text = exc_info_to_string(self, err, test)
    finally:
        self.buffer = buffered
    if buffered:
        for output, line in zip(captured(self), (r.STDOUT_LINE, r.STDERR_LINE)):
            if output:
                text += line % (output if output.endswith('\n') else output + '\n')
    return text
def safe_restore(self):
    if self.buffer:
        if self._mirrorOutput:
            for output, stream in zip(captured(self), (self._original_stdout, self._original_stderr)):
                if output:
                    stream.write(output if output.endswith('\n') else output + '\n')
        sys.stdout, sys.stderr = self._original_stdout, self._original_stderr
        for b in (self._stdout_buffer, self._stderr_buffer):
            if b is not None:
                b.seek(0)
                b.truncate()
r.TestResult._exc_info_to_string = safe_exc_info_to_string
r.TestResult._restoreStdout = safe_restore

# Guarded: multiprocessing's spawn and forkserver start methods import the main script
# again in each child (as __mp_main__), which must not start another test run.
if __name__ == "__main__":
    from test.libregrtest.main import main
    main()
