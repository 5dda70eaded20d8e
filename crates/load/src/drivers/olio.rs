//! Olio's operations (olio-spec.md, "The driver"), as its Faban driver performs them: each one
//! loads a page and the assets it references (through the user's browser cache), follows
//! links from the pages the user last saw, logs in as a loaded user (password = its id),
//! registers new users above the loaded ids, and posts events with an image and a PDF.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Result};
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::StatusCode;
use rand::rngs::SmallRng;
use rand::Rng;

use crate::browser::{Browser, Failure, Multipart, Outcome, Response};
use crate::engine::Driver;
use crate::workload::Workload;

/// The operations this driver performs, by the names workload files use.
pub const OPERATIONS: [&str; 7] = ["HomePage", "Login", "TagSearch", "EventDetail", "PersonDetail", "AddPerson", "AddEvent"];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    HomePage,
    Login,
    TagSearch,
    EventDetail,
    PersonDetail,
    AddPerson,
    AddEvent,
}

/// Olio's session cookie (Flask's).
const SESSION_COOKIE: &str = "session";

#[derive(Clone)]
pub struct Olio {
    addr: SocketAddr,
    host: String,
    /// Loaded user accounts: user i is `user{i}` with password `i`, 1..=users.
    registered_users: u64,
    /// Loaded tags `tag1..tagN` (tag1 the most used).
    tags: u64,
    ops: Vec<Op>,
    timeout: Duration,
    /// Sent for assets by warm browsers.
    warm_since: String,
    /// Shared by the copies [`Olio::for_site`] makes (a fleet has one per site).
    image: Bytes,
    document: Bytes,
}

pub struct OlioUser {
    id: u64,
    browser: Browser,
    /// Event ids linked from the last HomePage or TagSearch page.
    event_links: Vec<u64>,
    /// Tag names in the last page's tag cloud.
    tag_links: Vec<String>,
    /// New accounts this user registered.
    registered: u64,
}

impl Olio {
    pub fn new(workload: &Workload, addr: SocketAddr, registered_users: u64, timeout: Duration) -> Result<Olio> {
        let mut ops = Vec::new();
        for op in &workload.operations {
            ops.push(match op.name.as_str() {
                "HomePage" => Op::HomePage,
                "Login" => Op::Login,
                "TagSearch" => Op::TagSearch,
                "EventDetail" => Op::EventDetail,
                "PersonDetail" => Op::PersonDetail,
                "AddPerson" => Op::AddPerson,
                "AddEvent" => Op::AddEvent,
                other => bail!("the olio driver has no operation {other:?} (it has {})", OPERATIONS.join(", ")),
            });
        }
        if registered_users == 0 {
            bail!("the olio driver logs in as loaded users: give the number of loaded users (--registered-users)");
        }
        Ok(Olio {
            addr,
            host: addr.to_string(),
            registered_users,
            tags: tag_count(registered_users),
            ops,
            timeout,
            warm_since: "Thu, 01 Jan 2026 00:00:00 GMT".into(),
            image: Bytes::from(sample_png()),
            document: Bytes::from(sample_pdf()),
        })
    }
}

impl Olio {
    /// This driver aimed at one site of many served on its address: requests carry `host` in
    /// their Host header, and log in as that site's `registered_users` loaded accounts.
    pub fn for_site(&self, host: &str, registered_users: u64) -> Result<Olio> {
        if registered_users == 0 {
            bail!("{host}: the olio driver logs in as loaded users, and the site has none");
        }
        if host.is_empty() || HeaderValue::from_str(host).is_err() {
            bail!("{host:?} is not a Host header value");
        }
        Ok(Olio { host: host.to_string(), registered_users, tags: tag_count(registered_users), ..self.clone() })
    }
}

/// Olio's loader rule: tags = round(5000 (1 - e^(-U/10000)) / (1 + e^(-U/10000))), U users.
pub fn tag_count(users: u64) -> u64 {
    let x = (-(users as f64) / 10_000.0).exp();
    (5000.0 * (1.0 - x) / (1.0 + x)).round().max(1.0) as u64
}

impl Driver for Olio {
    type User = OlioUser;

    fn new_user(&self, id: u64, cold: bool, _rng: &mut SmallRng) -> OlioUser {
        let warm = (!cold).then(|| self.warm_since.clone());
        OlioUser {
            id,
            browser: Browser::new(self.addr, self.host.clone(), warm, self.timeout),
            event_links: Vec::new(),
            tag_links: Vec::new(),
            registered: 0,
        }
    }

    async fn run(&self, user: &mut OlioUser, op: usize, rng: &mut SmallRng, counters: &mut BTreeMap<String, u64>) -> Result<(), Failure> {
        let before = user.browser.sent();
        let outcome = match self.ops[op] {
            Op::HomePage => self.home_page(user, rng).await,
            Op::Login => self.login(user, rng).await,
            Op::TagSearch => self.tag_search(user, rng).await,
            Op::EventDetail => self.event_detail(user, rng, counters).await,
            Op::PersonDetail => self.person_detail(user, rng).await,
            Op::AddPerson => self.add_person(user, rng).await,
            Op::AddEvent => self.add_event(user, rng).await,
        };
        user.browser.count_since(before, counters);
        outcome
    }
}

impl Olio {
    /// A page and every asset it references, as a browser loads it.
    async fn page(&self, user: &mut OlioUser, path: &str) -> Outcome<Response> {
        let resp = user.browser.get(path).await?;
        expect(&resp, &[StatusCode::OK], path)?;
        for asset in assets(&resp.text()) {
            user.browser.asset(&asset).await?;
        }
        Ok(resp)
    }

    async fn home_page(&self, user: &mut OlioUser, _rng: &mut SmallRng) -> Outcome<()> {
        let resp = self.page(user, "/").await?;
        let text = resp.text();
        user.event_links = event_links(&text);
        user.tag_links = tag_links(&text);
        Ok(())
    }

    async fn login(&self, user: &mut OlioUser, rng: &mut SmallRng) -> Outcome<()> {
        if user.browser.logged_in(SESSION_COOKIE) {
            self.logout(user).await?;
        }
        let id = rng.random_range(1..=self.registered_users);
        self.page(user, "/users/login").await?;
        let (name, password) = (format!("user{id}"), id.to_string());
        let resp = user.browser.post_form("/users/login", &[("username", &name), ("password", &password)]).await?;
        if !resp.status.is_redirection() || !user.browser.logged_in(SESSION_COOKIE) {
            return Err(Failure::new("login refused", format!("{name}: status {}", resp.status)));
        }
        self.follow(user, &resp).await
    }

    async fn logout(&self, user: &mut OlioUser) -> Outcome<()> {
        let resp = user.browser.get("/users/logout").await?;
        expect(&resp, &[StatusCode::OK, StatusCode::FOUND, StatusCode::SEE_OTHER], "/users/logout")?;
        user.browser.forget_cookies();
        Ok(())
    }

    async fn tag_search(&self, user: &mut OlioUser, rng: &mut SmallRng) -> Outcome<()> {
        let tag = if !user.tag_links.is_empty() && rng.random::<f64>() < 0.5 {
            user.tag_links[rng.random_range(0..user.tag_links.len())].clone()
        } else {
            // Popular tags more often, as the loader tags events (negative exponential over
            // rank with mean a tenth of the tags).
            let mean = (self.tags as f64 / 10.0).max(1.0);
            let rank = (-mean * (1.0 - rng.random::<f64>()).ln()) as u64 % self.tags;
            format!("tag{}", rank + 1)
        };
        let query = form_urlencoded::Serializer::new(String::new()).append_pair("tag", &tag).finish();
        let resp = self.page(user, &format!("/events/tag_search?{query}")).await?;
        user.event_links = event_links(&resp.text());
        Ok(())
    }

    async fn event_detail(&self, user: &mut OlioUser, rng: &mut SmallRng, counters: &mut BTreeMap<String, u64>) -> Outcome<()> {
        if user.event_links.is_empty() {
            // A session that has not seen a list yet starts from the home page's links.
            let resp = user.browser.get("/").await?;
            user.event_links = event_links(&resp.text());
            if user.event_links.is_empty() {
                return Err(Failure::new("no events", "the home page links no event"));
            }
        }
        let id = user.event_links[rng.random_range(0..user.event_links.len())];
        let path = format!("/events/{id}");
        let resp = self.page(user, &path).await?;
        let text = resp.text();
        // Attend 10% of the time when logged in and not attending yet.
        let can_attend = user.browser.logged_in(SESSION_COOKIE) && text.contains(&format!("action=\"/events/{id}/attend\""));
        if can_attend {
            *counters.entry("attend_eligible".into()).or_default() += 1;
            if rng.random::<f64>() < 0.10 {
                let resp = user.browser.post_form(&format!("/events/{id}/attend"), &[]).await?;
                expect(&resp, &[StatusCode::OK, StatusCode::FOUND, StatusCode::SEE_OTHER], "attend")?;
                *counters.entry("attend".into()).or_default() += 1;
            }
        }
        Ok(())
    }

    async fn person_detail(&self, user: &mut OlioUser, rng: &mut SmallRng) -> Outcome<()> {
        let id = rng.random_range(1..=self.registered_users);
        self.page(user, &format!("/users/{id}")).await.map(|_| ())
    }

    async fn add_person(&self, user: &mut OlioUser, rng: &mut SmallRng) -> Outcome<()> {
        if user.browser.logged_in(SESSION_COOKIE) {
            self.logout(user).await?;
        }
        self.page(user, "/users/new").await?;
        user.registered += 1;
        // Unique across agents and runs: the simulated user's id, a counter and random bits.
        let name = format!("u{}x{}r{:x}", user.id, user.registered, rng.random::<u32>());
        let password = format!("pw{}", rng.random::<u32>());
        let form = Multipart::new(rng.random())
            .text("username", &name)
            .text("password", &password)
            .text("password_confirm", &password)
            .text("firstname", "Load")
            .text("lastname", &format!("User{}", user.id))
            .text("email", &format!("{name}@example.com"))
            .text("telephone", "555-0100")
            .text("summary", &text_of(rng, 200))
            .text("timezone", "America/Los_Angeles")
            .text("street1", "1 Main St")
            .text("street2", "")
            .text("city", "Berkeley")
            .text("state", "CA")
            .text("zip", &format!("{:05}", rng.random_range(10_000..99_999)))
            .text("country", "USA")
            .file("image", "me.png", "image/png", &self.image);
        let resp = user.browser.post_multipart("/users", form).await?;
        if !resp.status.is_redirection() {
            return Err(Failure::new("register refused", format!("{name}: status {}: {}", resp.status, first_error(&resp.text()))));
        }
        self.follow(user, &resp).await
    }

    async fn add_event(&self, user: &mut OlioUser, rng: &mut SmallRng) -> Outcome<()> {
        if !user.browser.logged_in(SESSION_COOKIE) {
            return Err(Failure::new("not logged in", "AddEvent without a session (the Login before it failed)"));
        }
        self.page(user, "/events/new").await?;
        let day = chrono_like_date(rng);
        let tags: Vec<String> = (0..rng.random_range(1..=7)).map(|_| format!("tag{}", rng.random_range(1..=self.tags))).collect();
        let form = Multipart::new(rng.random())
            .text("title", &text_of(rng, 40))
            .text("summary", &text_of(rng, 600))
            .text("description", &text_of(rng, 2000))
            .text("telephone", "555-0199")
            .text("date", &day)
            .text("time", &format!("{}:{:02}", rng.random_range(7..=21), [0, 15, 30, 45][rng.random_range(0..4)]))
            .text("tags", &tags.join(" "))
            .text("street1", "2 Oak Ave")
            .text("street2", "")
            .text("city", "Oakland")
            .text("state", "CA")
            .text("zip", &format!("{:05}", rng.random_range(10_000..99_999)))
            .text("country", "USA")
            .file("image", "event.png", "image/png", &self.image)
            .file("document", "event.pdf", "application/pdf", &self.document);
        let resp = user.browser.post_multipart("/events", form).await?;
        if !resp.status.is_redirection() {
            return Err(Failure::new("add event refused", format!("status {}: {}", resp.status, first_error(&resp.text()))));
        }
        self.follow(user, &resp).await
    }

    /// Load the page a redirect points to (a browser would).
    async fn follow(&self, user: &mut OlioUser, resp: &Response) -> Outcome<()> {
        let Some(location) = &resp.location else {
            return Err(Failure::new("bad redirect", "no Location"));
        };
        let path = location.find("://").and_then(|i| location[i + 3..].find('/').map(|j| &location[i + 3 + j..])).unwrap_or(location);
        self.page(user, path).await.map(|_| ())
    }
}

fn expect(resp: &Response, ok: &[StatusCode], what: &str) -> Outcome<()> {
    if ok.contains(&resp.status) {
        Ok(())
    } else {
        Err(Failure::new(format!("http {}", resp.status.as_u16()), what.to_string()))
    }
}

/// Values of `attr="..."` attributes that start with `prefix`.
fn attr_values<'a>(html: &'a str, attr: &str, prefix: &str) -> Vec<&'a str> {
    let needle = format!("{attr}=\"{prefix}");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(&needle) {
        let start = i + attr.len() + 2;
        let Some(len) = rest[start..].find('"') else {
            break;
        };
        out.push(&rest[start..start + len]);
        rest = &rest[start + len..];
    }
    out
}

/// The static assets and file-store images a page references (stylesheets, scripts, images).
fn assets(html: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for attr in ["src", "href"] {
        for prefix in ["/static/", "/files/"] {
            for a in attr_values(html, attr, prefix) {
                let a = a.replace("&amp;", "&");
                if !v.contains(&a) {
                    v.push(a);
                }
            }
        }
    }
    v
}

fn event_links(html: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = attr_values(html, "href", "/events/").iter().filter_map(|p| p["/events/".len()..].parse().ok()).collect();
    ids.dedup();
    ids
}

fn tag_links(html: &str) -> Vec<String> {
    attr_values(html, "href", "/events/tag_search?tag=")
        .iter()
        .map(|p| p["/events/tag_search?tag=".len()..].split('&').next().unwrap_or("").to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn first_error(html: &str) -> String {
    html.find("class=\"error").map(|i| html[i..].chars().take(160).collect()).unwrap_or_else(|| html.chars().take(120).collect())
}

const WORDS: [&str; 16] = [
    "music", "festival", "open", "air", "concert", "meetup", "talk", "wine", "tasting", "park", "run", "art", "show", "market", "film",
    "night",
];

fn text_of(rng: &mut SmallRng, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 10);
    while s.len() < chars {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

/// A date 1-540 days ahead, YYYY-MM-DD, from the days-since-epoch of today (UTC).
fn chrono_like_date(rng: &mut SmallRng) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() / 86_400;
    civil_from_days(now as i64 + rng.random_range(1..=540))
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> String {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

/// A small valid PNG (8x8, one colour): signature, IHDR, IDAT (zlib), IEND, each chunk with
/// its CRC.
fn sample_png() -> Vec<u8> {
    use std::io::Write;
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let (w, h) = (8u32, 8u32);
    let row: Vec<u8> = std::iter::once(0u8).chain((0..w).flat_map(|_| [0x2a, 0x7a, 0xb0])).collect(); // filter byte, then RGB
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    for _ in 0..h {
        z.write_all(&row).expect("writing to memory");
    }
    let idat = z.finish().expect("writing to memory");
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &idat);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// A minimal valid one-page PDF.
fn sample_pdf() -> Vec<u8> {
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>",
    ];
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n{o}\nendobj\n", i + 1).as_bytes());
    }
    let xref = pdf.len();
    pdf.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
    for off in offsets {
        pdf.extend_from_slice(format!("{off:010} 00000 n \n").as_bytes());
    }
    pdf.extend_from_slice(format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes());
    pdf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_assets_are_found() {
        let html = r#"<link rel="stylesheet" href="/static/css/olio.css"><script src="/static/js/olio.js"></script>
            <a href="/events/12"><img src="/files/ab.png"></a><a href="/events/12">x</a><a href="/events/new">new</a>
            <a href="/events/tag_search?tag=tag3">tag3</a><a href="/events/tag_search?tag=tag9&amp;page=2">"#;
        assert_eq!(assets(html), vec!["/static/js/olio.js", "/files/ab.png", "/static/css/olio.css"]);
        assert_eq!(event_links(html), vec![12]);
        assert_eq!(tag_links(html), vec!["tag3", "tag9"]);
    }

    #[test]
    fn tag_formula_and_dates() {
        assert_eq!(tag_count(100_000), 5000);
        assert_eq!(tag_count(1000), 250);
        assert_eq!(civil_from_days(0), "1970-01-01");
        assert_eq!(civil_from_days(20_415), "2025-11-23");
    }

    #[test]
    fn the_sample_files_are_well_formed() {
        let png = sample_png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(sample_pdf().starts_with(b"%PDF-1.4"));
    }
}
