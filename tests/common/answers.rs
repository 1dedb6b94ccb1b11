//! Checks every answer a test server gives against the OpenAPI document.
//!
//! The service emits one `debug` event per routed answer (method, route
//! template, status, error code; `context_service::api::answer`). The
//! first [`TestServer`](super::TestServer) installs a process-wide
//! subscriber that checks each against `GET /openapi.json`'s document and
//! keeps what does not match; [`check`] (run after every [`Caller`]
//! request and when a server is dropped) fails the test that sees it. So
//! every API test also tests the document: a route answering a status or
//! an error code its entry does not list fails the suite.
//!
//! [`Caller`]: super::Caller

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Mutex, Once, OnceLock};

use context_service::api::answer::TARGET;
use context_service::api::openapi::ERROR_CODES_EXTENSION;
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::Layer;

/// One answer: method, route template, status, error code (`""` if none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Answer {
    pub method: String,
    pub route: String,
    pub status: u16,
    pub code: String,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} -> {}", self.method, self.route, self.status)?;
        if !self.code.is_empty() {
            write!(f, " {}", self.code)?;
        }
        Ok(())
    }
}

static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SEEN: Mutex<BTreeSet<Answer>> = Mutex::new(BTreeSet::new());

/// The document the servers serve (with `/metrics` on the API address).
pub(crate) fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        serde_json::to_value(context_service::api::openapi_document(true))
            .expect("the OpenAPI document encodes")
    })
}

/// Installs the recorder, once per process.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Recorder);
        // Another global subscriber (none today) would only turn the
        // recording off, never fail a test.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Fails (panics) when an answer so far was not documented, unless the
/// thread is already panicking. Reports each violation once.
pub(crate) fn check() {
    if std::thread::panicking() {
        return;
    }
    let found: Vec<String> = std::mem::take(&mut *VIOLATIONS.lock().expect("violations"));
    if !found.is_empty() {
        panic!(
            "answers not listed in the OpenAPI document (see src/api/openapi.rs):\n  {}",
            found.join("\n  ")
        );
    }
}

/// Every answer recorded so far in this process.
pub(crate) fn seen() -> BTreeSet<Answer> {
    SEEN.lock().expect("seen").clone()
}

/// Why `answer` is not what the document lists for its route, if it is
/// not.
pub(crate) fn undocumented(doc: &Value, answer: &Answer) -> Option<String> {
    let Some(item) = doc["paths"].get(&answer.route) else {
        return Some(format!("{answer}: the route is not in the document"));
    };
    let method = answer.method.to_ascii_lowercase();
    // axum answers HEAD with the GET handler.
    let op = match item.get(&method) {
        Some(op) => op,
        None if method == "head" => &item["get"],
        None => &Value::Null,
    };
    if op.is_null() {
        // Go's mux answers a method the route does not take (`405`, plain
        // text, no code): not an operation of the route.
        if answer.status == 405 && answer.code.is_empty() {
            return None;
        }
        return Some(format!("{answer}: the method is not in the document"));
    }
    let Some(response) = op["responses"].get(answer.status.to_string()) else {
        return Some(format!("{answer}: the status is not listed"));
    };
    if answer.code.is_empty() {
        return None;
    }
    let listed = response[ERROR_CODES_EXTENSION]
        .as_array()
        .is_some_and(|codes| codes.iter().any(|c| c == answer.code.as_str()));
    if listed {
        None
    } else {
        Some(format!(
            "{answer}: the code is not in {ERROR_CODES_EXTENSION} {}",
            response[ERROR_CODES_EXTENSION]
        ))
    }
}

/// The layer: records the service's answer events.
struct Recorder;

impl<S: Subscriber> Layer<S> for Recorder {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == TARGET
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut answer = Answer {
            method: String::new(),
            route: String::new(),
            status: 0,
            code: String::new(),
        };
        event.record(&mut answer);
        if let Some(why) = undocumented(document(), &answer) {
            eprintln!("OpenAPI: {why}");
            VIOLATIONS.lock().expect("violations").push(why);
        }
        SEEN.lock().expect("seen").insert(answer);
    }
}

impl Visit for Answer {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "route" => self.route = value.to_owned(),
            "code" => self.code = value.to_owned(),
            "method" => self.method = value.to_owned(),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "status" {
            self.status = u16::try_from(value).unwrap_or(0);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `method = %method` arrives as a Display-backed Debug value.
        if field.name() == "method" {
            self.method = format!("{value:?}");
        }
    }
}
