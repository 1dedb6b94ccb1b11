//! What Go's `net/http` `ServeMux` answers around the handlers, so an
//! upstream client sees the same bytes:
//!
//! - a path that is not clean (`//healthz`, `/a/./b`, `/a/../b`) redirects
//!   `307` to the cleaned path (query kept), with Go's small HTML body on
//!   `GET`;
//! - an unknown path is `404` `404 page not found\n` (text/plain);
//! - a known path with the wrong method is `405` `Method Not Allowed\n`
//!   with `Allow` listing the methods sorted, comma-space separated, `HEAD`
//!   wherever `GET` is.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Go's `http.Error`: the text and a newline, as `text/plain`, `nosniff`.
fn go_error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// The fallback of the router: Go's `NotFound`.
pub async fn not_found() -> Response {
    go_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// Middleware: redirects non-clean paths, and turns the router's bare
/// `405` into Go's.
pub async fn go_mux(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let cleaned = clean_path(path);
    if cleaned != path {
        let mut location = escape_path(&cleaned);
        if let Some(query) = req.uri().query() {
            location.push('?');
            location.push_str(query);
        }
        return redirect(req.method(), &location);
    }
    let resp = next.run(req).await;
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && !resp.headers().contains_key(header::CONTENT_TYPE)
    {
        return method_not_allowed(resp.headers());
    }
    resp
}

fn method_not_allowed(headers: &HeaderMap) -> Response {
    let mut methods: Vec<String> = headers
        .get_all(header::ALLOW)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    if methods.iter().any(|m| m == "GET") {
        methods.push("HEAD".to_owned());
    }
    methods.sort();
    methods.dedup();
    let mut resp = go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    if let Ok(allow) = HeaderValue::from_str(&methods.join(", ")) {
        resp.headers_mut().insert(header::ALLOW, allow);
    }
    resp
}

/// Go's `http.Redirect` with `307 Temporary Redirect`.
fn redirect(method: &Method, location: &str) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::TEMPORARY_REDIRECT)
        .header(header::LOCATION, location);
    let body = if method == Method::GET || method == Method::HEAD {
        builder = builder.header(header::CONTENT_TYPE, "text/html; charset=utf-8");
        // `fmt.Fprintln` of a string that ends in ".\n": two newlines.
        format!(
            "<a href=\"{}\">Temporary Redirect</a>.\n\n",
            html_escape(location)
        )
    } else {
        String::new()
    };
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(body)
    };
    builder
        .body(body)
        .unwrap_or_else(|_| go_error(StatusCode::BAD_REQUEST, "400 Bad Request"))
}

/// Go's `cleanPath`: `path.Clean` of the path rooted at `/`, keeping a
/// trailing slash.
pub fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return "/".to_owned();
    }
    let rooted = if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("/{p}")
    };
    let mut cleaned = clean(&rooted);
    if rooted.ends_with('/') && cleaned != "/" {
        cleaned.push('/');
    }
    cleaned
}

/// Go's `path.Clean` of a rooted path: no empty, `.` or `..` segments.
fn clean(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// `url.URL{Path: p}.EscapedPath()`: Go escapes what is not allowed
/// unescaped in a path (including `%`, so escapes in a redirected path are
/// escaped again, as Go does).
fn escape_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_like_go() {
        for (raw, want) in [
            ("/healthz", "/healthz"),
            ("//healthz", "/healthz"),
            ("/./", "/"),
            ("/../", "/"),
            ("/a/../b", "/b"),
            ("/v1/namespaces//contexts", "/v1/namespaces/contexts"),
            ("/healthz/", "/healthz/"),
            ("/a//b//", "/a/b/"),
            ("/a/.", "/a"),
            ("/a/./", "/a/"),
            ("", "/"),
        ] {
            assert_eq!(clean_path(raw), want, "{raw:?}");
        }
        assert_eq!(escape_path("/a%2Fb c!"), "/a%252Fb%20c%21");
    }
}
