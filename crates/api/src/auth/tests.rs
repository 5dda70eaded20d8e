//! The admin plane's checks ([`super::Guard`]) against every kind of credential and path.

use super::*;

fn headers(values: &[&str]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for v in values {
        map.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
    }
    map
}

fn guard(required: bool) -> (Guard, String) {
    let token = Token::generate().unwrap();
    let text = token.as_str().to_string();
    (Guard::new(token, required, "127.0.0.1:5000", Arc::new(Tenants::in_memory())), text)
}

#[test]
fn only_run_map_and_get_status_are_open() {
    for (method, path) in [
        (Method::POST, "/run/echo"),
        (Method::POST, "/map/echo"),
        (Method::POST, "/map/echo?chunk=4"),
        (Method::GET, "/run/hello/ada/x?y=1"),
        (Method::DELETE, "/run/app/"),
        (Method::PUT, "/run/x"),
        (Method::GET, "/status"),
        (Method::HEAD, "/status"),
    ] {
        assert!(is_open(&method, path), "{method} {path}");
    }
    for (method, path) in [
        (Method::GET, "/registry"),
        (Method::POST, "/registry/echo"),
        (Method::DELETE, "/registry/echo"),
        (Method::GET, "/stats"),
        (Method::GET, "/metrics"),
        (Method::GET, "/packages"),
        (Method::GET, "/pid"),
        (Method::POST, "/status"),
        (Method::GET, "/status/"),
        (Method::GET, "/run"),
        (Method::GET, "/running"),
        (Method::POST, "/map"),
        (Method::POST, "/mapping/echo"),
        (Method::GET, "//run/echo"),
        (Method::GET, "/RUN/echo"),
        (Method::GET, "/%72un/echo"),
        (Method::GET, "/nowhere"),
        (Method::GET, "/"),
    ] {
        assert!(!is_open(&method, path), "{method} {path}");
    }
}

#[test]
fn the_header_is_one_bearer_token() {
    assert_eq!(credential(&headers(&[])), Credential::Missing);
    assert_eq!(credential(&headers(&["Bearer abc"])), Credential::Bearer("abc"));
    assert_eq!(credential(&headers(&["bearer  abc "])), Credential::Bearer("abc"));
    assert_eq!(credential(&headers(&["BEARER abc"])), Credential::Bearer("abc"));
    for malformed in ["abc", "Bearer", "Bearer ", "Basic YWRhOmFkYQ==", "Bearer a b", "Bearerabc", ""] {
        assert_eq!(credential(&headers(&[malformed])), Credential::Malformed, "{malformed:?}");
    }
    assert_eq!(credential(&headers(&["Bearer abc", "Bearer abc"])), Credential::Malformed);
    let mut opaque = HeaderMap::new();
    opaque.insert(header::AUTHORIZATION, HeaderValue::from_bytes(b"Bearer \xff").unwrap());
    assert_eq!(credential(&opaque), Credential::Malformed);
}

#[test]
fn tokens_are_equal_only_byte_for_byte() {
    assert!(same_token(b"0123abcd", b"0123abcd"));
    assert!(!same_token(b"0123abcd", b"0123abce"));
    assert!(!same_token(b"0123abcd", b"1123abcd"));
    assert!(!same_token(b"0123abc", b"0123abcd"));
    assert!(!same_token(b"", b"0123abcd"));
    assert!(same_token(b"", b""));
}

#[test]
fn protected_paths_need_the_worker_token() {
    let (guard, token) = guard(true);
    let ok = format!("Bearer {token}");
    let wrong = format!("Bearer {}", Token::generate().unwrap().as_str());
    assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&[&ok])), Verdict::Allow);
    assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&[])), Verdict::Unauthorized);
    assert_eq!(guard.decide(&Method::GET, "/nowhere", &headers(&[])), Verdict::Unauthorized);
    assert!(matches!(guard.decide(&Method::GET, "/stats", &headers(&[&wrong])), Verdict::Forbidden(_)));
    assert!(matches!(guard.decide(&Method::GET, "/stats", &headers(&[&token])), Verdict::Forbidden(_)));
    assert!(matches!(guard.decide(&Method::POST, "/registry/x", &headers(&[&ok, &ok])), Verdict::Forbidden(_)));
    // Open paths ignore credentials, good or bad.
    assert_eq!(guard.decide(&Method::POST, "/run/echo", &headers(&[])), Verdict::Allow);
    assert_eq!(guard.decide(&Method::POST, "/run/echo", &headers(&[&wrong])), Verdict::Allow);
    assert_eq!(guard.decide(&Method::GET, "/status", &headers(&["junk"])), Verdict::Allow);
}

#[test]
fn auth_off_allows_everything() {
    let (guard, _) = guard(false);
    assert_eq!(guard.decide(&Method::DELETE, "/registry/x", &headers(&[])), Verdict::Allow);
    assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&["Bearer wrong"])), Verdict::Allow);
}

#[test]
fn the_worker_token_is_recognised_for_removal_before_a_lambda_sees_it() {
    let (guard, token) = guard(true);
    let value = |v: &str| HeaderValue::from_str(v).unwrap();
    assert!(guard.is_worker_credential("authorization", &value(&format!("Bearer {token}"))));
    assert!(guard.is_worker_credential("Authorization", &value(&format!("bearer {token}"))));
    assert!(!guard.is_worker_credential("authorization", &value("Bearer the-app-s-own")));
    assert!(!guard.is_worker_credential("authorization", &value("Basic YWRhOmFkYQ==")));
    assert!(!guard.is_worker_credential("x-token", &value(&format!("Bearer {token}"))));
}

fn with_cookies(values: &[&str]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for v in values {
        map.append(header::COOKIE, HeaderValue::from_str(v).unwrap());
    }
    map
}

#[test]
fn the_console_login_and_logout_are_open_and_nothing_else_of_it() {
    for (method, path) in [
        (Method::GET, "/console/login"),
        (Method::HEAD, "/console/login"),
        (Method::POST, "/console/login"),
        (Method::POST, "/console/logout"),
    ] {
        assert!(is_open(&method, path), "{method} {path}");
    }
    for (method, path) in [
        (Method::GET, "/console"),
        (Method::GET, "/console/"),
        (Method::GET, "/console/assets/console.js"),
        (Method::GET, "/console/logout"),
        (Method::DELETE, "/console/login"),
        (Method::PUT, "/console/login"),
        (Method::GET, "/console/login/"),
        (Method::GET, "/console/loginx"),
        (Method::POST, "/console/login/../../registry/x"),
    ] {
        assert!(!is_open(&method, path), "{method} {path}");
    }
}

#[test]
fn cookies_are_read_from_every_cookie_header() {
    let map = with_cookies(&["a=1; sprout_console=abc;b=2", "sprout_console = \"def\"", "x=sprout_console=no"]);
    assert_eq!(cookies(&map, SESSION_COOKIE).collect::<Vec<_>>(), ["abc", "def"]);
    assert_eq!(cookies(&with_cookies(&["sprout_consolex=1; xsprout_console=2"]), SESSION_COOKIE).count(), 0);
    assert_eq!(cookies(&HeaderMap::new(), SESSION_COOKIE).count(), 0);
}

#[test]
fn the_console_cookie_authorizes_get_and_head_only() {
    let (guard, token) = guard(true);
    let session = guard.session().unwrap().to_string();
    assert_ne!(session, token, "the session is not the token");
    let cookie = with_cookies(&[&format!("theme=dark; {SESSION_COOKIE}={session}")]);
    for path in ["/stats", "/stats/history", "/registry", "/registry/echo", "/logs/echo", "/logs", "/console", "/console/assets/console.js"]
    {
        assert_eq!(guard.decide(&Method::GET, path, &cookie), Verdict::Allow, "GET {path}");
        assert_eq!(guard.decide(&Method::HEAD, path, &cookie), Verdict::Allow, "HEAD {path}");
    }
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH, Method::OPTIONS] {
        assert!(matches!(guard.decide(&method, "/registry/echo", &cookie), Verdict::Forbidden(_)), "{method}");
    }
    assert!(matches!(guard.decide(&Method::POST, "/console/logout/", &cookie), Verdict::Forbidden(_)));
    // The token is no session: a cookie holding it is refused.
    let token_cookie = with_cookies(&[&format!("{SESSION_COOKIE}={token}")]);
    assert!(matches!(guard.decide(&Method::GET, "/stats", &token_cookie), Verdict::Forbidden(_)));
    // One stale cookie beside the right one (another path's) does not spoil it.
    let two = with_cookies(&[&format!("{SESSION_COOKIE}=stale; {SESSION_COOKIE}={session}")]);
    assert_eq!(guard.decide(&Method::GET, "/stats", &two), Verdict::Allow);
    // Another worker run's session is refused.
    let (other, _) = self::guard(true);
    assert!(matches!(other.decide(&Method::GET, "/stats", &cookie), Verdict::Forbidden(_)));
}

#[test]
fn a_wrong_or_empty_console_cookie_is_refused() {
    let (guard, _) = guard(true);
    let session = guard.session().unwrap();
    let mut near = session.to_string();
    near.replace_range(63.., if session.ends_with('0') { "1" } else { "0" });
    for value in [near.as_str(), "", "abc", &session[..63]] {
        let cookie = with_cookies(&[&format!("{SESSION_COOKIE}={value}")]);
        assert!(matches!(guard.decide(&Method::GET, "/stats", &cookie), Verdict::Forbidden(_)), "{value:?}");
    }
    assert_eq!(guard.decide(&Method::GET, "/stats", &with_cookies(&["other=1"])), Verdict::Unauthorized);
}

#[test]
fn a_browser_without_a_session_is_sent_to_the_login() {
    let (guard, token) = guard(true);
    let wrong_cookie = with_cookies(&[&format!("{SESSION_COOKIE}=stale")]);
    for path in ["/console", "/console/"] {
        assert_eq!(guard.decide(&Method::GET, path, &headers(&[])), Verdict::LogIn, "{path}");
        assert_eq!(guard.decide(&Method::HEAD, path, &headers(&[])), Verdict::LogIn, "{path}");
        assert_eq!(guard.decide(&Method::GET, path, &wrong_cookie), Verdict::LogIn, "{path}");
        assert_eq!(guard.decide(&Method::GET, path, &headers(&[&format!("Bearer {token}")])), Verdict::Allow);
        // A client that sent a token gets the API's answer, not a page.
        assert!(matches!(guard.decide(&Method::GET, path, &headers(&["Bearer wrong"])), Verdict::Forbidden(_)));
        assert!(matches!(guard.decide(&Method::POST, path, &headers(&[])), Verdict::Unauthorized));
    }
    // Only the console's pages: the API and the console's assets keep the JSON 401.
    for path in ["/stats", "/console/assets/console.js", "/consoles", "/nowhere", "/"] {
        assert_eq!(guard.decide(&Method::GET, path, &headers(&[])), Verdict::Unauthorized, "{path}");
    }
    assert!(matches!(guard.decide(&Method::GET, "/stats", &wrong_cookie), Verdict::Forbidden(_)));
}

#[test]
fn the_bearer_token_still_decides_when_a_cookie_comes_too() {
    let (guard, token) = guard(true);
    let session = guard.session().unwrap().to_string();
    let mut both = headers(&[&format!("Bearer {token}")]);
    both.append(header::COOKIE, HeaderValue::from_str(&format!("{SESSION_COOKIE}={session}")).unwrap());
    assert_eq!(guard.decide(&Method::DELETE, "/registry/echo", &both), Verdict::Allow);
    let mut wrong = headers(&["Bearer wrong"]);
    wrong.append(header::COOKIE, HeaderValue::from_str(&format!("{SESSION_COOKIE}={session}")).unwrap());
    assert!(matches!(guard.decide(&Method::GET, "/stats", &wrong), Verdict::Forbidden(_)));
    assert!(guard.is_token(&token) && guard.is_token(&format!("{token}\n")) && !guard.is_token(&session) && !guard.is_token(""));
}

#[test]
fn auth_off_opens_the_console_too() {
    let (guard, _) = guard(false);
    assert_eq!(guard.decide(&Method::GET, "/console", &headers(&[])), Verdict::Allow);
}

#[test]
fn no_lambda_sees_the_console_session() {
    let (guard, _) = guard(true);
    let session = guard.session().unwrap().to_string();
    let value = |v: &str| HeaderValue::from_str(v).unwrap();
    assert!(guard.is_worker_credential("cookie", &value(&format!("a=1; {SESSION_COOKIE}={session}"))));
    assert!(guard.is_worker_credential("Cookie", &value(&format!("{SESSION_COOKIE}={session}"))));
    assert!(!guard.is_worker_credential("cookie", &value(&format!("{SESSION_COOKIE}=stale; a=1"))));
    assert!(!guard.is_worker_credential("cookie", &value("a=1")));
    assert!(!guard.is_worker_credential("x-cookie", &value(&format!("{SESSION_COOKIE}={session}"))));
    let kept = guard.without_session(&value(&format!("a=1; {SESSION_COOKIE}={session};b=2"))).unwrap();
    assert_eq!(kept, "a=1; b=2");
    assert_eq!(guard.without_session(&value(&format!("{SESSION_COOKIE}={session}"))), None);
    assert_eq!(guard.without_session(&value("a=1")).unwrap(), "a=1");
    let mut headers = HeaderMap::new();
    headers.insert(header::COOKIE, value(&format!("theirs=1; {SESSION_COOKIE}={session}; more=2")));
    headers.insert(header::AUTHORIZATION, value(&format!("Bearer {}", guard.token.as_str())));
    headers.insert("x-kept", value("yes"));
    let seen = guard.lambda_headers(&headers);
    assert_eq!(seen, [("cookie".to_string(), "theirs=1; more=2".to_string()), ("x-kept".to_string(), "yes".to_string())]);
    let mut only = HeaderMap::new();
    only.insert(header::COOKIE, value(&format!("{SESSION_COOKIE}={session}")));
    assert!(guard.lambda_headers(&only).is_empty());
}

#[test]
fn a_tenant_key_reaches_its_registry_and_logs_paths_only() {
    let (guard, _) = guard(true);
    guard.tenants.add("acme", 1).unwrap();
    let key = guard.tenants.issue("acme", tenants::Scope::default(), 1).unwrap().key;
    let read_only = guard.tenants.issue("acme", tenants::Scope { read_only: true, ..Default::default() }, 1).unwrap().key;
    let bearer = |k: &str| headers(&[&format!("Bearer {k}")]);
    for (method, path) in [
        (Method::GET, "/registry"),
        (Method::GET, "/registry/echo"),
        (Method::POST, "/registry/echo"),
        (Method::DELETE, "/registry/echo"),
        (Method::GET, "/logs/echo"),
        (Method::GET, "/logs"),
    ] {
        assert!(matches!(guard.decide(&method, path, &bearer(&key)), Verdict::Tenant(g) if g.tenant == "acme"), "{method} {path}");
    }
    for (method, path) in [
        (Method::GET, "/stats"),
        (Method::GET, "/tenants"),
        (Method::POST, "/tenants/acme/keys"),
        (Method::GET, "/registry/"),
        (Method::GET, "/registry/a/b"),
        (Method::GET, "/logs/"),
        (Method::GET, "/sites/a/b"),
        (Method::GET, "/console/assets"),
        (Method::GET, "/registryx"),
    ] {
        assert!(matches!(guard.decide(&method, path, &bearer(&key)), Verdict::Forbidden(_)), "{method} {path}");
    }
    assert!(matches!(guard.decide(&Method::GET, "/registry/echo", &bearer(&read_only)), Verdict::Tenant(_)));
    assert!(
        matches!(guard.decide(&Method::DELETE, "/registry/echo", &bearer(&read_only)), Verdict::Forbidden(m) if m.contains("read-only"))
    );
    // Open paths stay open, whatever key comes; no lambda sees a tenant's key.
    assert_eq!(guard.decide(&Method::POST, "/run/echo", &bearer(&key)), Verdict::Allow);
    assert!(guard.is_worker_credential("authorization", &HeaderValue::from_str(&format!("Bearer {key}")).unwrap()));
}

#[test]
fn a_tenant_key_in_the_console_cookie_reads_its_own_and_changes_nothing() {
    let (guard, _) = guard(true);
    guard.tenants.add("acme", 1).unwrap();
    let issued = guard.tenants.issue("acme", tenants::Scope::default(), 1).unwrap();
    let cookie = with_cookies(&[&format!("{SESSION_COOKIE}={}", issued.key)]);
    for path in ["/console", "/console/assets/console.js", "/console/session", "/registry", "/stats/history", "/logs/echo"] {
        assert!(matches!(guard.decide(&Method::GET, path, &cookie), Verdict::Tenant(g) if g.scope.read_only), "{path}");
    }
    assert!(matches!(guard.decide(&Method::GET, "/stats", &cookie), Verdict::Forbidden(_)));
    assert!(matches!(guard.decide(&Method::DELETE, "/registry/echo", &cookie), Verdict::Forbidden(_)));
    assert!(guard.is_worker_credential("cookie", &HeaderValue::from_str(&format!("a=1; {SESSION_COOKIE}={}", issued.key)).unwrap()));
    guard.tenants.revoke("acme", &issued.record.id, 2).unwrap();
    assert!(matches!(guard.decide(&Method::GET, "/registry", &cookie), Verdict::Forbidden(m) if m.contains("log in again")));
}

#[test]
fn the_401_message_says_where_the_token_is() {
    let (guard, token) = guard(true);
    let message = guard.unauthorized_message();
    assert!(message.contains("DIR/api-token") && message.contains("$SPROUT_TOKEN"), "{message}");
    assert!(message.contains("/run/sprout/api/127.0.0.1:5000") && !message.contains(&token), "{message}");
}
