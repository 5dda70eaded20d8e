//! A lambda's `ol.yaml`, OpenLambda's per-lambda configuration: the HTTP methods it accepts,
//! the environment its handler starts with (and so its entry file and entry point), whether a
//! sandbox serves more than one request, and the Kafka topics that invoke it. Parsed and
//! checked once, at upload; kept with the lambda's version.
//!
//! ```yaml
//! triggers:
//!   http:                     # no http section: every method
//!     - method: GET
//!     - method: POST
//!   kafka:
//!     - bootstrap_servers: ["127.0.0.1:9092"]
//!       topics: [events]
//!       group_id: events-lambda
//!       auto_offset_reset: earliest     # or latest (the default)
//! environment:                # set before the handler's module is imported; also in .env
//!   GREETING: hello
//!   OL_ENTRY_FILE: app.py     # the module to import instead of f.py
//!   OL_WSGI_ENTRY: application  # the WSGI callable, if not `app` (OL_ASGI_ENTRY: ASGI)
//! reuse-sandbox: false        # a fresh sandbox per request, destroyed after it
//! isolation: gvisor           # Sprout's: a stronger isolation class than the operator gave
//! auth: key                   # Sprout's: /run and the app port want a key of the lambda's
//!                             # tenant (or the operator's token); default none: open
//! preload:                    # Sprout's: load this once for every lambda sharing this code
//!   modules: [app.web]        # imported in a code Zygote the lambda's sandboxes fork from
//!   call: app.web:prepare     # then called there (optional)
//!   settings: [app.toml]      # each lambda's own files: left out of what is shared
//! ```
//!
//! `preload` is for many lambdas running one application with different settings (sites):
//! lambdas whose code is the same but for their `settings` files, with the same packages,
//! share one Zygote that has imported `modules` from that code (without any lambda's
//! settings or environment) and called `call`; each sandbox forked from it then reads its
//! own settings. What runs there must not read settings, the environment or the network.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::BackendKind;

/// The file a lambda's configuration is read from, at the top of its directory.
pub const FILE_NAME: &str = "ol.yaml";
/// The entry file without `OL_ENTRY_FILE`.
pub const DEFAULT_ENTRY: &str = "f.py";
/// Environment variables a lambda may not set: the platform's own.
const RESERVED_PREFIX: &str = "SPROUT_";

/// A lambda's configuration, as the worker keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LambdaConfig {
    /// The methods `/run/<name>` and the app port accept; `None`: every method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_methods: Option<Vec<String>>,
    /// Variables set in the handler's process before its module is imported.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// False: a sandbox serves one request and is destroyed after it.
    #[serde(default = "yes")]
    pub reuse_sandbox: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka: Vec<KafkaTrigger>,
    /// The isolation class the lambda asks for; it may raise the operator's, never lower it
    /// ([`crate::isolation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<BackendKind>,
    /// What a code Zygote shared with lambdas of the same code loads ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preload: Option<Preload>,
    /// Whether invoking the lambda from outside needs a key.
    #[serde(default, skip_serializing_if = "InvokeAuth::is_open")]
    pub auth: InvokeAuth,
}

/// ol.yaml's `auth`: who may invoke the lambda through `/run` and the app port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvokeAuth {
    /// Anyone (OpenLambda's behaviour).
    #[default]
    None,
    /// A key of the lambda's tenant that may see it, or the operator's token.
    Key,
}

impl InvokeAuth {
    pub fn is_open(&self) -> bool {
        *self == InvokeAuth::None
    }
}

/// ol.yaml's `preload` (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preload {
    /// Modules of the lambda's code to import, by dotted name.
    #[serde(default)]
    pub modules: Vec<String>,
    /// `module:function` to call after them, with no arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// Paths (files or directories, relative to the lambda's top) that each lambda has its
    /// own of: left out of the shared code and of what makes two lambdas' code the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
}

impl Preload {
    fn check(&self) -> Result<(), String> {
        if self.modules.is_empty() && self.call.is_none() {
            return Err("preload: name the modules to import (modules) or a function to call (call)".into());
        }
        if let Some(bad) = self.modules.iter().find(|m| !is_module_name(m)) {
            return Err(format!("preload: {bad:?} is not a module's dotted name"));
        }
        if let Some(call) = &self.call {
            let valid = call.split_once(':').is_some_and(|(module, function)| is_module_name(module) && is_identifier(function));
            if !valid {
                return Err(format!("preload: call {call:?} must be module:function"));
            }
        }
        for path in &self.settings {
            let parts: Vec<&str> = path.split('/').collect();
            if path.is_empty() || path.starts_with('/') || parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
                return Err(format!("preload: settings {path:?} must be a path inside the lambda, like site.toml or conf/site.toml"));
            }
            if path == FILE_NAME {
                return Err(format!("preload: settings cannot hold {FILE_NAME}, which says what is shared"));
            }
        }
        Ok(())
    }
}

fn is_module_name(name: &str) -> bool {
    name.split('.').all(is_identifier)
}

fn yes() -> bool {
    true
}

impl Default for LambdaConfig {
    fn default() -> LambdaConfig {
        LambdaConfig {
            http_methods: None,
            environment: BTreeMap::new(),
            reuse_sandbox: true,
            kafka: Vec::new(),
            isolation: None,
            preload: None,
            auth: InvokeAuth::None,
        }
    }
}

/// Where a Kafka trigger reads from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTrigger {
    pub bootstrap_servers: Vec<String>,
    pub topics: Vec<String>,
    pub group_id: String,
    /// Where a consumer group with no committed offset starts.
    #[serde(default)]
    pub auto_offset_reset: OffsetReset,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffsetReset {
    Earliest,
    #[default]
    Latest,
}

impl OffsetReset {
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        }
    }
}

/// Why a lambda's configuration was refused: the file, and the line (1-based) when the
/// reason has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct ConfigError {
    pub file: &'static str,
    pub line: Option<usize>,
    pub reason: String,
}

impl ConfigError {
    fn at(line: Option<usize>, reason: impl Into<String>) -> ConfigError {
        ConfigError { file: FILE_NAME, line, reason: reason.into() }
    }

    fn in_dotenv(reason: impl std::fmt::Display) -> ConfigError {
        ConfigError { file: ".env", line: None, reason: reason.to_string() }
    }
}

/// The file as written: every key known, or it is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    triggers: Option<Triggers>,
    #[serde(default)]
    environment: Option<BTreeMap<String, Scalar>>,
    #[serde(default, rename = "reuse-sandbox")]
    reuse_sandbox: Option<bool>,
    #[serde(default)]
    isolation: Option<String>,
    #[serde(default)]
    preload: Option<Preload>,
    #[serde(default)]
    auth: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Triggers {
    #[serde(default)]
    http: Option<Vec<HttpTrigger>>,
    #[serde(default)]
    kafka: Vec<KafkaTrigger>,
    /// OpenLambda declares cron triggers but runs none; Sprout refuses them rather than
    /// accept a trigger that never fires.
    #[serde(default)]
    cron: Option<yaml_serde::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpTrigger {
    method: String,
}

/// An environment value: YAML's scalars all become strings (`PORT: 8080` is "8080").
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    String(String),
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    fn into_string(self) -> String {
        match self {
            Scalar::String(s) => s,
            Scalar::Bool(b) => b.to_string(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
        }
    }
}

/// A lambda's configuration from its `ol.yaml` and `.env`, either of which may be absent. As
/// in OpenLambda, an `environment` in `ol.yaml` replaces the `.env` (the worker then writes
/// it there); without one the `.env`'s variables are the environment.
pub fn load(ol_yaml: Option<&str>, dotenv: Option<&str>) -> Result<LambdaConfig, ConfigError> {
    let mut config = parse(ol_yaml.unwrap_or(""))?;
    if let (true, Some(dotenv)) = (config.environment.is_empty(), dotenv) {
        for (key, value) in parse_dotenv(dotenv).map_err(ConfigError::in_dotenv)? {
            check_variable(&key, &value).map_err(ConfigError::in_dotenv)?;
            config.environment.insert(key, value);
        }
        config.check_entry().map_err(ConfigError::in_dotenv)?;
    }
    Ok(config)
}

/// Parse and check an `ol.yaml`.
pub fn parse(text: &str) -> Result<LambdaConfig, ConfigError> {
    if text.trim().is_empty() {
        return Ok(LambdaConfig::default());
    }
    let file: File = yaml_serde::from_str(text).map_err(|e| ConfigError::at(e.location().map(|l| l.line()), without_location(&e)))?;
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).map(|i| i + 1);
    let mut config = LambdaConfig { reuse_sandbox: file.reuse_sandbox.unwrap_or(true), ..LambdaConfig::default() };
    if let Some(class) = file.isolation {
        let kind = BackendKind::from_name(&class);
        let names = BackendKind::ALL.map(|k| k.name()).join(", ");
        config.isolation =
            Some(kind.ok_or_else(|| ConfigError::at(line_of("isolation"), format!("isolation: {class:?} is not one of {names}")))?);
    }
    config.auth = match file.auth.as_deref() {
        None | Some("none") => InvokeAuth::None,
        Some("key") => InvokeAuth::Key,
        Some(other) => return Err(ConfigError::at(line_of("auth"), format!("auth: {other:?} is not none or key"))),
    };
    if let Some(preload) = file.preload {
        preload.check().map_err(|reason| ConfigError::at(line_of("preload"), reason))?;
        config.preload = Some(preload);
    }
    if let Some(triggers) = file.triggers {
        if triggers.cron.is_some() {
            return Err(ConfigError::at(line_of("cron"), "cron triggers are not supported (OpenLambda declares them but runs none)"));
        }
        if let Some(http) = triggers.http {
            let mut methods = Vec::new();
            for t in http {
                if t.method != "*" && !is_token(&t.method) {
                    let line = (!t.method.is_empty()).then(|| line_of(&t.method)).flatten().or_else(|| line_of("method"));
                    return Err(ConfigError::at(line, format!("{:?} is not an HTTP method", t.method)));
                }
                if !methods.contains(&t.method) {
                    methods.push(t.method);
                }
            }
            // `method: "*"` is every method, as no http section is.
            config.http_methods = (!methods.iter().any(|m| m == "*")).then_some(methods);
        }
        for k in &triggers.kafka {
            check_kafka(k).map_err(|reason| ConfigError::at(line_of("kafka"), reason))?;
        }
        config.kafka = triggers.kafka;
    }
    for (key, value) in file.environment.unwrap_or_default() {
        let value = value.into_string();
        check_variable(&key, &value).map_err(|reason| ConfigError::at(line_of(&key), reason))?;
        config.environment.insert(key, value);
    }
    config.check_entry().map_err(|reason| ConfigError::at(line_of("OL_"), reason))?;
    Ok(config)
}

impl LambdaConfig {
    /// The file whose module is the lambda's entry (`OL_ENTRY_FILE`, or f.py).
    pub fn entry_file(&self) -> &str {
        self.environment.get("OL_ENTRY_FILE").map(String::as_str).unwrap_or(DEFAULT_ENTRY)
    }

    /// Whether `method` may invoke the lambda.
    pub fn allows(&self, method: &str) -> bool {
        self.http_methods.as_ref().is_none_or(|allowed| allowed.iter().any(|m| m == method))
    }

    /// OpenLambda's answer to any other method, word for word (Go's `%v` of a []string).
    pub fn not_allowed_body(&self, method: &str) -> String {
        let allowed = self.http_methods.as_deref().unwrap_or_default().join(" ");
        format!("HTTP method not allowed. Sent: {method}, Allowed: [{allowed}]\n")
    }

    /// The environment as a dotenv file (`KEY="value"`, quotes and backslashes escaped).
    pub fn dotenv(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.environment {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            out += &format!("{k}=\"{escaped}\"\n");
        }
        out
    }

    fn check_entry(&self) -> Result<(), String> {
        let entry = self.entry_file();
        let module = entry.strip_suffix(".py").ok_or_else(|| format!("OL_ENTRY_FILE must name a .py file, not {entry:?}"))?;
        if !is_identifier(module) {
            return Err(format!("OL_ENTRY_FILE {entry:?} must be a .py file at the lambda's top level named as a Python module"));
        }
        for key in ["OL_WSGI_ENTRY", "OL_ASGI_ENTRY"] {
            if let Some(name) = self.environment.get(key).filter(|n| !is_identifier(n)) {
                return Err(format!("{key} {name:?} is not a Python name"));
            }
        }
        Ok(())
    }
}

/// A `.env` file's variables: `KEY=value` lines (`export ` before the key allowed), `#`
/// comments, values bare (trimmed, up to a ` #` comment), in single quotes (literal) or in
/// double quotes (`\n`, `\"` and `\\` escapes). Nothing is substituted: `${HOME}` stays as
/// written, since the worker's own environment must never reach a lambda.
fn parse_dotenv(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {}: no `=` in {raw:?}", i + 1));
        };
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('\'') {
            inner.strip_suffix('\'').ok_or_else(|| format!("line {}: an unclosed single quote", i + 1))?.to_string()
        } else if let Some(inner) = value.strip_prefix('"') {
            let inner = inner.strip_suffix('"').ok_or_else(|| format!("line {}: an unclosed double quote", i + 1))?;
            let mut unescaped = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    unescaped.push(c);
                    continue;
                }
                match chars.next() {
                    Some('n') => unescaped.push('\n'),
                    Some(other) => unescaped.push(other),
                    None => unescaped.push('\\'),
                }
            }
            unescaped
        } else {
            value.split(" #").next().unwrap_or("").trim_end().to_string()
        };
        out.push((key.trim().to_string(), value));
    }
    Ok(out)
}

fn check_variable(key: &str, value: &str) -> Result<(), String> {
    if !is_env_name(key) {
        return Err(format!("{key:?} is not an environment variable name"));
    }
    if key.starts_with(RESERVED_PREFIX) {
        return Err(format!("{key}: variables starting with {RESERVED_PREFIX} are the platform's"));
    }
    if value.contains('\0') {
        return Err(format!("{key}: a value cannot hold a NUL byte"));
    }
    Ok(())
}

fn check_kafka(k: &KafkaTrigger) -> Result<(), String> {
    if k.topics.is_empty() || k.topics.iter().any(|t| t.is_empty()) {
        return Err("a Kafka trigger needs at least one topic, none empty".into());
    }
    if k.bootstrap_servers.is_empty() || k.bootstrap_servers.iter().any(|s| !s.contains(':')) {
        return Err("a Kafka trigger needs bootstrap_servers as host:port".into());
    }
    if k.group_id.is_empty() {
        return Err("a Kafka trigger needs a group_id".into());
    }
    Ok(())
}

/// yaml_serde's message says " at line L column C" (the line is reported on its own); the
/// rest of the message stays.
fn without_location(e: &yaml_serde::Error) -> String {
    let text = e.to_string();
    let Some(start) = text.find(" at line ") else { return text };
    let after = &text[start..];
    let end = after.find(" column ").map(|c| c + " column ".len()).map(|c| c + after[c..].bytes().take_while(u8::is_ascii_digit).count());
    match end {
        Some(end) => format!("{}{}", &text[..start], &after[end..]),
        None => text[..start].to_string(),
    }
}

/// An HTTP token (RFC 9110, section 5.6.2).
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_env_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_identifier(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_or_an_empty_one_is_every_method_f_py_and_reuse() {
        let config = parse("").unwrap();
        assert_eq!(config, LambdaConfig::default());
        assert!(config.allows("PATCH"));
        assert_eq!(config.entry_file(), "f.py");
        assert!(config.reuse_sandbox);
    }

    #[test]
    fn auth_is_none_or_key_and_nothing_else() {
        assert_eq!(parse("").unwrap().auth, InvokeAuth::None);
        assert_eq!(parse("auth: none\n").unwrap().auth, InvokeAuth::None);
        assert_eq!(parse("auth: key\n").unwrap().auth, InvokeAuth::Key);
        let err = parse("reuse-sandbox: true\nauth: token\n").unwrap_err();
        assert_eq!((err.line, err.reason.as_str()), (Some(2), "auth: \"token\" is not none or key"));
        // Kept with the version as the worker stores it; an open lambda's JSON is as before.
        let kept: LambdaConfig = serde_json::from_value(serde_json::to_value(parse("auth: key\n").unwrap()).unwrap()).unwrap();
        assert_eq!(kept.auth, InvokeAuth::Key);
        assert!(serde_json::to_value(LambdaConfig::default()).unwrap().get("auth").is_none());
    }

    #[test]
    fn http_methods_limit_what_invokes_and_others_get_openlambdas_words() {
        let config = parse("triggers:\n  http:\n    - method: GET\n    - method: POST\n").unwrap();
        assert!(config.allows("GET") && config.allows("POST") && !config.allows("PUT") && !config.allows("get"));
        assert_eq!(config.not_allowed_body("PUT"), "HTTP method not allowed. Sent: PUT, Allowed: [GET POST]\n");
        let star = parse("triggers:\n  http:\n    - method: \"*\"\n").unwrap();
        assert!(star.allows("DELETE") && star.http_methods.is_none());
        let none = parse("triggers:\n  http: []\n").unwrap();
        assert!(!none.allows("GET"));
        assert_eq!(none.not_allowed_body("GET"), "HTTP method not allowed. Sent: GET, Allowed: []\n");
    }

    #[test]
    fn environment_values_become_strings_and_a_dotenv() {
        let config = parse("environment:\n  GREETING: \"say \\\"hi\\\"\"\n  PORT: 8080\n  DEBUG: true\n  OL_ENTRY_FILE: app.py\n").unwrap();
        assert_eq!(config.environment["PORT"], "8080");
        assert_eq!(config.environment["DEBUG"], "true");
        assert_eq!(config.entry_file(), "app.py");
        assert_eq!(config.dotenv(), "DEBUG=\"true\"\nGREETING=\"say \\\"hi\\\"\"\nOL_ENTRY_FILE=\"app.py\"\nPORT=\"8080\"\n");
    }

    #[test]
    fn reuse_sandbox_and_kafka_triggers() {
        let text = "reuse-sandbox: false\ntriggers:\n  kafka:\n    - bootstrap_servers: [\"127.0.0.1:9092\"]\n      topics: [a, b]\n      group_id: g\n      auto_offset_reset: earliest\n";
        let config = parse(text).unwrap();
        assert!(!config.reuse_sandbox);
        assert_eq!(config.kafka[0].topics, ["a", "b"]);
        assert_eq!(config.kafka[0].auto_offset_reset, OffsetReset::Earliest);
        let latest = parse("triggers:\n  kafka:\n    - bootstrap_servers: [\"k:9092\"]\n      topics: [a]\n      group_id: g\n").unwrap();
        assert_eq!(latest.kafka[0].auto_offset_reset, OffsetReset::Latest);
    }

    #[test]
    fn a_dotenv_is_the_environment_unless_ol_yaml_has_one() {
        let dotenv = "# settings\nA=1\nB=\"two words\"\n";
        let config = load(None, Some(dotenv)).unwrap();
        assert_eq!(config.environment, BTreeMap::from([("A".into(), "1".into()), ("B".into(), "two words".into())]));
        let replaced = load(Some("environment:\n  C: 3\n"), Some(dotenv)).unwrap();
        assert_eq!(replaced.environment, BTreeMap::from([("C".into(), "3".into())]));
        let quoted = "export A='${HOME} stays'\nB=\"line\\nbreak \\\"q\\\"\"\nC=bare value # comment\n";
        let config = load(None, Some(quoted)).unwrap();
        assert_eq!(config.environment["A"], "${HOME} stays");
        assert_eq!(config.environment["B"], "line\nbreak \"q\"");
        assert_eq!(config.environment["C"], "bare value");
        assert!(load(None, Some("A='open\n")).unwrap_err().reason.contains("unclosed single quote"));
        assert!(load(None, Some("just words\n")).unwrap_err().reason.contains("no `=`"));
        let e = load(None, Some("SPROUT_X=1\n")).unwrap_err();
        assert!(e.to_string().starts_with(".env: SPROUT_X"), "{e}");
        assert!(load(None, Some("OL_ENTRY_FILE=main.js\n")).is_err());
    }

    #[test]
    fn preload_names_modules_a_call_and_each_lambdas_own_settings() {
        let config =
            parse("preload:\n  modules: [olio.web, olio.views_events]\n  call: olio.web:prepare\n  settings: [olio.toml, conf/site]\n")
                .unwrap();
        let preload = config.preload.unwrap();
        assert_eq!(preload.modules, ["olio.web", "olio.views_events"]);
        assert_eq!(preload.call.as_deref(), Some("olio.web:prepare"));
        assert_eq!(preload.settings, ["olio.toml", "conf/site"]);
        assert!(parse("").unwrap().preload.is_none());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_their_line() {
        let cases = [
            ("triggers:\n  http:\n    - method: GET\nenviroment:\n  A: b\n", Some(4), "unknown field `enviroment`"),
            ("triggers:\n  http:\n    - methods: GET\n", Some(3), "unknown field `methods`"),
            ("triggers:\n  http:\n    - method: \"GE T\"\n", Some(3), "is not an HTTP method"),
            ("triggers: [\n", Some(1), "invalid type: sequence"),
            ("environment:\n  A: \"unclosed\n  B: c\n", Some(4), "found unexpected end of stream, while scanning a quoted scalar"),
            ("reuse-sandbox: maybe\n", Some(1), "reuse-sandbox"),
            ("environment:\n  A: b\n  9X: c\n", Some(3), "not an environment variable name"),
            ("environment:\n  SPROUT_SERVICE_DB: x\n", Some(2), "are the platform's"),
            ("environment:\n  OL_ENTRY_FILE: app.js\n", Some(2), "must name a .py file"),
            ("environment:\n  OL_ENTRY_FILE: sub/app.py\n", Some(2), "at the lambda's top level"),
            ("environment:\n  OL_WSGI_ENTRY: my-app\n", Some(2), "is not a Python name"),
            ("triggers:\n  cron:\n    - schedule: \"* * * * *\"\n", Some(2), "cron triggers are not supported"),
            ("triggers:\n  kafka:\n    - bootstrap_servers: [\"k:9092\"]\n      topics: []\n      group_id: g\n", Some(2), "at least one topic"),
            ("triggers:\n  kafka:\n    - bootstrap_servers: [\"k:9092\"]\n      topics: [a]\n      group_id: g\n      auto_offset_reset: middle\n", Some(6), "unknown variant `middle`"),
            ("preload: {}\n", Some(1), "name the modules to import"),
            ("preload:\n  modules: [app-web]\n", Some(1), "is not a module's dotted name"),
            ("preload:\n  call: app.web\n", Some(1), "must be module:function"),
            ("preload:\n  modules: [app]\n  settings: [../secrets]\n", Some(1), "must be a path inside the lambda"),
            ("preload:\n  modules: [app]\n  settings: [/etc/passwd]\n", Some(1), "must be a path inside the lambda"),
            ("preload:\n  modules: [app]\n  settings: [ol.yaml]\n", Some(1), "cannot hold ol.yaml"),
            ("preload:\n  modules: [app]\n  setting: [a.toml]\n", Some(3), "unknown field `setting`"),
        ];
        for (text, line, reason) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
            assert!(e.to_string().starts_with("ol.yaml line "), "{e}");
        }
    }
}
