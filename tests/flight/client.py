"""Flight SQL client checks for `epifusion serve`, run by tests/integration/flight.rs.

Each check is a subcommand; it exits non-zero (with the reason on stderr) when the server's
answer is wrong. Clients are real: ADBC's Flight SQL driver (adbc-driver-flightsql) and pyarrow.

    python3 client.py URI TOKEN CHECK [ARGS...]

URI is grpc://127.0.0.1:PORT or grpc+tls://127.0.0.1:PORT; TOKEN may be '' (no token).
"""

import sys
import threading

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow.parquet as pq
from adbc_driver_flightsql import DatabaseOptions
from adbc_driver_manager import AdbcStatusCode, Error


def connect(uri, token, tls_root=None):
    """One ADBC connection (one gRPC connection, so one server session)."""
    kwargs = {}
    if token:
        kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = "Bearer " + token
    if tls_root:
        with open(tls_root) as f:
            kwargs[DatabaseOptions.TLS_ROOT_CERTS.value] = f.read()
    return flight_sql.connect(uri, db_kwargs=kwargs, autocommit=True)


def query(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def without_timing(table):
    """The fit tables' `seconds` column is a wall-clock time: not compared."""
    return table.drop_columns(["seconds"]) if "seconds" in table.column_names else table


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def same_table(name, got, expected):
    """The same Arrow table: column names, types and values (but fit times)."""
    got, expected = without_timing(got), without_timing(expected)
    if not got.schema.equals(expected.schema, check_metadata=False):
        fail(f"{name}: schema differs\n got:      {got.schema}\n expected: {expected.schema}")
    if not got.equals(expected):
        fail(f"{name}: values differ\n got:      {got.to_pylist()}\n expected: {expected.to_pylist()}")


def expect_error(name, code, needle, fn):
    """`fn` must fail with ADBC status `code` and a message containing `needle`."""
    try:
        fn()
    except Error as e:
        if e.status_code != code or needle not in str(e):
            fail(f"{name}: expected {code.name} mentioning {needle!r}, got {e.status_code.name}: {e}")
        return
    fail(f"{name}: expected {code.name}, the call succeeded")


def same_as_cli(uri, token, sql, cli_parquet, tls_root=None):
    """SQL through Flight SQL gives the table the CLI wrote (`epifusion sql --output x.parquet`)."""
    with connect(uri, token, tls_root) as conn:
        same_table(sql, query(conn, sql), pq.read_table(cli_parquet))


def wrong_token(uri, token):
    with connect(uri, token + "-wrong") as conn:
        expect_error("wrong token", AdbcStatusCode.UNAUTHENTICATED, "wrong bearer token",
                     lambda: query(conn, "SELECT 1"))
    with connect(uri, "") as conn:
        expect_error("no token", AdbcStatusCode.UNAUTHENTICATED, "needs a bearer token",
                     lambda: query(conn, "SELECT 1"))


def read_only(uri, token):
    with connect(uri, token) as conn:
        for sql in ["CREATE VIEW v AS SELECT 1",
                    "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/hostname'",
                    "DROP TABLE rossi",
                    "COPY rossi TO '/tmp/epifusion-flight-copy.csv'",
                    "SET datafusion.execution.batch_size = 1"]:
            expect_error(sql, AdbcStatusCode.INVALID_ARGUMENT, "must be a read-only query",
                         lambda: query(conn, sql))
        # The connection still answers, and the shared table is still there.
        if query(conn, "SELECT count(*) AS n FROM rossi").to_pylist() != [{"n": 432}]:
            fail("rossi changed after the refused statements")


def failing_fit_is_one_error(uri, token, sql):
    """A failing fit fails its own query; the connection and the server go on."""
    with connect(uri, token) as conn:
        expect_error("failing fit", AdbcStatusCode.INTERNAL, "",
                     lambda: query(conn, "SELECT * FROM cox_fit('SELECT 1 AS time, 2 AS y')"))
        query(conn, sql)


def concurrent(uri, token, *pairs):
    """8 clients, each on its own connection, run fits at once: every answer is the CLI's."""
    cases = [(pairs[i], pq.read_table(pairs[i + 1])) for i in range(0, len(pairs), 2)]
    errors = []
    barrier = threading.Barrier(8)

    def client(k):
        sql, expected = cases[k % len(cases)]
        try:
            with connect(uri, token) as conn:
                barrier.wait()
                for _ in range(2):
                    got = without_timing(query(conn, sql))
                    if not got.equals(without_timing(expected)):
                        errors.append(f"client {k}: {sql}: {got.to_pylist()}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {k}: {e!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        fail("\n".join(errors))


def limits(uri, token):
    """With --query-timeout 2 --memory-limit 32M: a long statement is stopped at the time limit,
    an accumulator over the memory limit is refused; the connection goes on."""
    import time

    with connect(uri, token) as conn:
        started = time.monotonic()
        expect_error("time limit", AdbcStatusCode.TIMEOUT, "time limit",
                     lambda: query(conn, "SELECT sum(value * value) FROM range(1, 1000000000000)"))
        if time.monotonic() - started > 30:
            fail("the time limit did not stop the statement in time")
        expect_error("memory limit", AdbcStatusCode.INTERNAL, "esources exhausted",
                     lambda: query(conn, "SELECT array_agg(value) FROM range(1, 50000000)"))
        if query(conn, "SELECT 1 AS one").to_pylist() != [{"one": 1}]:
            fail("the connection does not answer after the refusals")


def sessions(uri, token, tls_root=None):
    """With --allow-writes: a view is its connection's own; another connection does not see it,
    and a shared table cannot be dropped by a client."""
    with connect(uri, token, tls_root) as a, connect(uri, token, tls_root) as b:
        query(a, "CREATE VIEW mine AS SELECT fin, count(*) AS n FROM rossi GROUP BY fin")
        if query(a, "SELECT sum(n) AS n FROM mine").to_pylist() != [{"n": 432}]:
            fail("the view of connection a is wrong")
        expect_error("another connection's view", AdbcStatusCode.INVALID_ARGUMENT, "mine",
                     lambda: query(b, "SELECT * FROM mine"))
        # DataFusion reports a refused DROP TABLE as "doesn't exist"; what matters is that the
        # table stays, for both connections.
        expect_error("dropping a shared table", AdbcStatusCode.INTERNAL, "rossi",
                     lambda: query(a, "DROP TABLE rossi"))
        expect_error("replacing a shared table", AdbcStatusCode.INVALID_ARGUMENT,
                     "shared by every client",
                     lambda: query(a, "CREATE OR REPLACE VIEW rossi AS SELECT 1 AS x"))
        for conn in (a, b):
            if query(conn, "SELECT count(*) AS n FROM rossi").to_pylist() != [{"n": 432}]:
                fail("a client dropped or replaced the shared table rossi")


if __name__ == "__main__":
    uri, token, check, *args = sys.argv[1:]
    {
        "same-as-cli": same_as_cli,
        "wrong-token": wrong_token,
        "read-only": read_only,
        "failing-fit": failing_fit_is_one_error,
        "concurrent": concurrent,
        "sessions": sessions,
        "limits": limits,
    }[check](uri, token, *args)
    print(f"{check}: ok")
