//! `sprout sites`: the app port's sites, a row per host, and one site in a line.

use std::fmt::Write as _;

use serde_json::Value;

use super::text::table;

/// `lambda echo, static /s/ → /srv/s` of a site.
pub(crate) fn describe_site(site: &Value) -> String {
    let mut out = site["lambda"].as_str().unwrap_or("?").to_string();
    let statics = static_list(&site["static"]);
    if statics != "-" {
        let _ = write!(out, ", static {statics}");
    }
    out
}

pub(super) fn static_list(statics: &Value) -> String {
    let parts: Vec<String> =
        statics.as_object().map(|o| o.iter().map(|(p, d)| format!("{p} → {}", d.as_str().unwrap_or("?"))).collect()).unwrap_or_default();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// `sprout sites ls`: a row per host (`*`: the default site).
pub fn render_sites(sites: &Value) -> String {
    let Some(sites) = sites.as_object().filter(|s| !s.is_empty()) else { return "no sites\n".to_string() };
    let rows: Vec<Vec<String>> = sites
        .iter()
        .map(|(host, s)| {
            vec![
                host.clone(),
                s["site"]["lambda"].as_str().unwrap_or("?").to_string(),
                s["source"].as_str().unwrap_or("?").to_string(),
                static_list(&s["site"]["static"]),
            ]
        })
        .collect();
    table(&["HOST", "LAMBDA", "SOURCE", "STATIC"], &rows, &[])
}
