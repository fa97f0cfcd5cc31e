"""Uses the Python client that openapi-python-client generated from codecage's OpenAPI
document, for the tests: nothing here knows the API but through that package.

Usage: openapi_client.py URL TOKEN   (with the generated `codecage_client` on PYTHONPATH)

Runs `print(6*7)`, opens a Python session, executes twice in it (the second call reads
what the first one left), closes it, and tries the answers that are errors: a closed
session (404) and a bad token (401). Prints one JSON object with what it saw.
"""

import json
import sys

from codecage_client import AuthenticatedClient
from codecage_client.api.runs import run
from codecage_client.api.sessions import (
    create_session,
    delete_session,
    execute,
    get_session,
    list_sessions,
)
from codecage_client.models import (
    CallOutcome,
    ErrorBody,
    ExecuteRequest,
    Lang,
    Outcome,
    RunRequest,
    SessionInfo,
    SessionRequest,
)


def main():
    url, token = sys.argv[1], sys.argv[2]
    seen = {}
    # Answers that do not match the document raise here (the models parse them strictly).
    client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)
    with client as client:
        outcome = run.sync(
            client=client,
            body=RunRequest(language=Lang.PYTHON, code="print(6*7)", timeout="60s"),
        )
        assert isinstance(outcome, Outcome), outcome
        seen["run"] = {
            "stdout": outcome.stdout,
            "exit_code": outcome.exit_code,
            "encoding": outcome.stdout_encoding.value,
            "files": outcome.files,
        }

        created = create_session.sync_detailed(
            client=client, body=SessionRequest(language=Lang.PYTHON)
        )
        info = created.parsed
        assert isinstance(info, SessionInfo), created
        seen["created"] = {"status": int(created.status_code), "language": info.language.value}
        seen["listed"] = [s.id for s in list_sessions.sync(client=client)] == [info.id]
        calls = []
        for code in ["x = 41\nprint('set')", "print(x + 1)"]:
            call = execute.sync(info.id, client=client, body=ExecuteRequest(code=code))
            assert isinstance(call, CallOutcome), call
            calls.append(
                {
                    "stdout": call.stdout,
                    "error": call.error,
                    "preserved": call.state.preserved,
                    "count": call.execution_count,
                    "displays": call.displays,
                }
            )
        seen["calls"] = calls
        seen["executions"] = get_session.sync(info.id, client=client).executions

        closed = delete_session.sync_detailed(info.id, client=client)
        seen["closed"] = int(closed.status_code)
        gone = execute.sync_detailed(info.id, client=client, body=ExecuteRequest(code="1"))
        assert isinstance(gone.parsed, ErrorBody), gone
        seen["gone"] = {"status": int(gone.status_code), "error": gone.parsed.error}

    bad = AuthenticatedClient(base_url=url, token="not-the-token", raise_on_unexpected_status=True)
    with bad as bad:
        refused = list_sessions.sync_detailed(client=bad)
        assert isinstance(refused.parsed, ErrorBody), refused
        seen["unauthorized"] = {
            "status": int(refused.status_code),
            "error": refused.parsed.error,
            "challenge": refused.headers.get("www-authenticate"),
        }
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
