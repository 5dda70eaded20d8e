//! The benchmark's TCP echo service, in this process (on the load generator's CPU): the
//! `echo` service the sandbox variants allow, the far end of a service round trip from inside
//! a sandbox ([`crate::isolation`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::OnceLock;

/// The port of the benchmark's echo service (started on first use, in this process, whose
/// CPU is the load generator's).
pub fn echo_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the echo service");
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || echo(stream));
            }
        });
        port
    })
}

fn echo(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}
