//! Request bodies decoded like upstream's Go `encoding/json` decoder: the
//! exact error text of syntax errors, EOFs, type errors (naming Go's types
//! and echoing number literals) and unknown fields, the first problem in
//! document order winning. Expected texts are Go 1.26's (the whole table,
//! with more cases, is `src/api/json/testdata/go_decode.jsonl`).

use crate::common::{json_of, Caller, TestServer};
use crate::compat_support::{assert_json, error_body, exact};

const POOLS: &str = "/v1/sandbox-pools";
const CONTEXTS: &str = "/v1/contexts";

/// POSTs `body` (any Content-Type: upstream does not look at it).
async fn post(caller: &Caller, path: &str, body: &str) -> reqwest::Response {
    caller.post_raw(path, "text/plain", body.to_owned()).await
}

async fn assert_invalid(caller: &Caller, path: &str, body: &str, message: &str) {
    let resp = post(caller, path, body).await;
    assert_json(resp, 400, &error_body("invalid_request", message)).await;
}

#[tokio::test]
async fn decode_errors_are_byte_exact() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let cases: &[(&str, &str, &str)] = &[
        (POOLS, "", "EOF"),
        (POOLS, " \n", "EOF"),
        (POOLS, "{\"name\":", "unexpected EOF"),
        (POOLS, "x", "invalid character 'x' looking for beginning of value"),
        (POOLS, "<pool/>", "invalid character '<' looking for beginning of value"),
        (POOLS, "{name:1}", "invalid character 'n' looking for beginning of object key string"),
        (POOLS, "{\"name\" 1}", "invalid character '1' after object key"),
        (POOLS, "{\"name\":\"a\" \"replicas\":1}", "invalid character '\"' after object key:value pair"),
        (POOLS, "{\"name\":\"a\",}", "invalid character '}' looking for beginning of object key string"),
        (POOLS, "{\"replicas\":tru}", "invalid character '}' in literal true (expecting 'e')"),
        (POOLS, "{\"name\":\"a\nb\"}", "invalid character '\\n' in string literal"),
        (POOLS, "{\"replicas\":01}", "invalid character '1' after object key:value pair"),
        (POOLS, "[]", "json: cannot unmarshal array into Go value of type pool.CreateRequest"),
        (POOLS, "\"pool\"", "json: cannot unmarshal string into Go value of type pool.CreateRequest"),
        (POOLS, "{\"replicas\":\"3\"}", "json: cannot unmarshal string into Go struct field CreateRequest.replicas of type int"),
        (POOLS, "{\"replicas\":3.5}", "json: cannot unmarshal number 3.5 into Go struct field CreateRequest.replicas of type int"),
        (POOLS, "{\"replicas\":3.0}", "json: cannot unmarshal number 3.0 into Go struct field CreateRequest.replicas of type int"),
        (POOLS, "{\"replicas\":1e20}", "json: cannot unmarshal number 1e20 into Go struct field CreateRequest.replicas of type int"),
        (POOLS, "{\"replicas\":18446744073709551616}", "json: cannot unmarshal number 18446744073709551616 into Go struct field CreateRequest.replicas of type int"),
        (POOLS, "{\"name\":5}", "json: cannot unmarshal number into Go struct field CreateRequest.name of type string"),
        (POOLS, "{\"workspace\":5}", "json: cannot unmarshal number into Go struct field CreateRequest.workspace of type pool.Workspace"),
        (POOLS, "{\"workspace\":[]}", "json: cannot unmarshal array into Go struct field CreateRequest.workspace of type pool.Workspace"),
        (POOLS, "{\"workspace\":{\"size\":5}}", "json: cannot unmarshal number into Go struct field Workspace.workspace.size of type string"),
        (POOLS, "{\"workspace\":{\"readOnly\":\"true\"}}", "json: cannot unmarshal string into Go struct field Workspace.workspace.readOnly of type bool"),
        (POOLS, "{\"bogus\":1}", "json: unknown field \"bogus\""),
        (POOLS, "{\"workspace\":{\"Bogus\":1}}", "json: unknown field \"Bogus\""),
        (POOLS, "{\"a<b\":1}", "json: unknown field \"a<b\""),
        (CONTEXTS, "[]", "json: cannot unmarshal array into Go value of type contextresource.CreateRequest"),
        (CONTEXTS, "{\"storage\":5}", "json: cannot unmarshal number into Go struct field CreateRequest.storage of type contextresource.Storage"),
        (CONTEXTS, "{\"storage\":{\"size\":5}}", "json: cannot unmarshal number into Go struct field Storage.storage.size of type string"),
        (CONTEXTS, "{\"type\":1}", "json: cannot unmarshal number into Go struct field CreateRequest.type of type string"),
        (CONTEXTS, "{\"storage\":{\"bogus\":true}}", "json: unknown field \"bogus\""),
    ];
    for (path, body, message) in cases {
        assert_invalid(&alice, path, body, message).await;
    }
}

#[tokio::test]
async fn the_first_problem_in_document_order_wins() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    let type_error =
        "json: cannot unmarshal string into Go struct field CreateRequest.replicas of type int";
    let unknown = "json: unknown field \"bogus\"";
    let size_error =
        "json: cannot unmarshal number into Go struct field Workspace.workspace.size of type string";
    for (body, message) in [
        ("{\"replicas\":\"3\",\"bogus\":1}", type_error),
        ("{\"bogus\":1,\"replicas\":\"3\"}", unknown),
        ("{\"workspace\":{\"size\":5,\"bogus\":1}}", size_error),
        ("{\"workspace\":{\"bogus\":1,\"size\":5}}", unknown),
        // The value of an unknown field is not looked into.
        ("{\"bogus\":{\"replicas\":\"x\"},\"name\":5}", unknown),
        // A later duplicate does not undo an earlier error.
        ("{\"replicas\":\"3\",\"replicas\":3}", type_error),
        // A syntax error anywhere comes before any type error.
        (
            "{\"replicas\":\"3\",\"name\":x}",
            "invalid character 'x' looking for beginning of value",
        ),
    ] {
        assert_invalid(&alice, POOLS, body, message).await;
    }
}

#[tokio::test]
async fn what_go_accepts_is_accepted() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    // Case-insensitive keys (Go's folding: KELVIN SIGN is a k, ſ an s),
    // the last duplicate winning, trailing data ignored, null as absent.
    let body = "{\"NAME\":\"x\",\"name\":\"demo\",\"Replicas\":2,\"wor\u{212a}space\":\
                {\"\u{17f}ize\":\"1Gi\",\"ACCESSMODE\":\"ReadWriteMany\",\"readOnly\":null},\
                \"warmPoolRef\":null} trailing {garbage";
    let created = json_of(post(&alice, POOLS, body).await, 201).await;
    assert_eq!(created["name"], "demo");
    assert_eq!(created["replicas"], 2);
    assert_eq!(created["workspace"]["accessMode"], "ReadWriteMany");
    // `İ` is no `i` to Go: an unknown field.
    assert_invalid(
        &alice,
        POOLS,
        "{\"repl\u{130}cas\":1}",
        "json: unknown field \"repl\u{130}cas\"",
    )
    .await;
}

#[tokio::test]
async fn a_body_over_one_mib_closes_the_connection() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    // The first value does not end within 1 MiB.
    let big = format!("{{\"name\":\"{}\"}}", "a".repeat(2 << 20));
    let got = exact(post(&alice, POOLS, &big).await).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (
            400,
            error_body("invalid_request", "http: request body too large").as_str()
        )
    );
    assert_eq!(got.headers.get("connection").unwrap(), "close");
    // A small first value followed by 2 MiB of spaces is fine (Go reads only
    // the first value), but the connection still closes.
    let padded = format!(
        "{{\"name\":\"padded\",\"replicas\":1,\"workspace\":{{\"size\":\"1Gi\",\"accessMode\":\"ReadWriteOnce\"}}}}{}",
        " ".repeat(2 << 20)
    );
    let got = exact(post(&alice, POOLS, &padded).await).await;
    assert_eq!(got.status, 201, "{}", got.body);
    assert_eq!(got.headers.get("connection").unwrap(), "close");
    // Exactly 1 MiB that ends inside the value: unexpected EOF, kept alive.
    let exact_limit = format!("{{{}", " ".repeat((1 << 20) - 1));
    let got = exact(post(&alice, POOLS, &exact_limit).await).await;
    assert_eq!(
        (got.status, got.body.as_str()),
        (
            400,
            error_body("invalid_request", "unexpected EOF").as_str()
        )
    );
    assert!(got.headers.get("connection").is_none());
}
