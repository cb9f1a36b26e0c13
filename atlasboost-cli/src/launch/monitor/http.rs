//! The `--metrics` endpoint's HTTP side: one `GET /metrics` (or `HEAD`) per connection,
//! answered with `Connection: close`, each connection on a thread of its own.
//!
//! Why not a general HTTP server crate: the one tried (`tiny_http`) answers every request
//! from one queue, in order, with writes that wait for the client, so a single client that
//! stops reading (a hung scraper, a slow proxy, a large cluster's page on a slow link) blocked
//! every later scrape for as long as it held its connection. Here a client can hold only its
//! own thread, for at most [`CLIENT_TIMEOUT`], and at most [`MAX_CLIENTS`] are served at once.
//! Prometheus needs nothing more: one request, one answer.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// The most connections served at once; one more is closed as it comes (a scraper retries at
/// its next interval).
pub const MAX_CLIENTS: usize = 16;

/// How long a client has to send its request (all of it), and, separately, to take the
/// answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest request head read; a longer one is answered 431.
const MAX_HEAD: usize = 8192;

/// How long, and how much, a client's unread bytes are waited for and dropped after the
/// answer (see [`respond`]).
const LINGER: Duration = Duration::from_secs(1);
const MAX_LINGER_BYTES: u64 = 64 << 10;

/// The Prometheus text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The server: its thread accepts until the `Server` is dropped.
pub struct Server {
    address: SocketAddr,
    /// Dropped to stop the accepting thread (its end sees the pipe hang up).
    _stop: OwnedFd,
}

impl Server {
    /// Listens on `address` and serves `page` (read afresh for each request) from a thread of
    /// its own.
    ///
    /// # Errors
    ///
    /// The address cannot be listened on, or the thread cannot start.
    pub fn serve(address: SocketAddr, page: Arc<Mutex<String>>) -> io::Result<Server> {
        let listener = TcpListener::bind(address)?;
        let address = listener.local_addr()?;
        // Close-on-exec: a worker that inherited the write end would keep the server up.
        let (stopped, stop) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let busy = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_until_stopped(&listener, &stopped, &busy, &page))?;
        Ok(Server {
            address,
            _stop: stop,
        })
    }

    /// Where it listens (the port the kernel chose for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

fn accept_until_stopped(
    listener: &TcpListener,
    stopped: &OwnedFd,
    busy: &Arc<AtomicUsize>,
    page: &Arc<Mutex<String>>,
) {
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stopped.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        if fds[1].any().unwrap_or(true) {
            return;
        }
        let Ok((stream, _)) = listener.accept() else {
            // Out of descriptors, say: the connection stays queued; try again shortly rather
            // than spin on a listener that stays readable.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            busy.fetch_sub(1, Ordering::AcqRel);
            // Closed at once: the others are not made to wait.
            continue;
        }
        let (done, page) = (Arc::clone(busy), Arc::clone(page));
        let started = std::thread::Builder::new()
            .name("metrics-client".into())
            .spawn(move || {
                let _ = answer(stream, &page);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if started.is_err() {
            busy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A connection whose reads and writes, together, end by a deadline (a socket's own timeouts
/// bound each call alone: a client sending a byte every 9 s would never time out).
struct Timed {
    stream: TcpStream,
    until: Instant,
}

impl Timed {
    /// The time left, set as the socket's timeout for the next call; an error once none is.
    fn arm(&self, write: bool) -> io::Result<()> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match write {
            true => self.stream.set_write_timeout(Some(left)),
            false => self.stream.set_read_timeout(Some(left)),
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(false)?;
        self.stream.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(true)?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads one request from `stream` and answers it.
fn answer(stream: TcpStream, page: &Mutex<String>) -> io::Result<()> {
    let mut stream = Timed {
        stream,
        until: Instant::now() + CLIENT_TIMEOUT,
    };
    let head = match read_head(&mut stream)? {
        Some(head) => head,
        None => {
            return respond(
                &mut stream,
                false,
                431,
                "431 request head too large\n",
                None,
            );
        }
    };
    let request_line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let request_line = String::from_utf8_lossy(request_line);
    let mut words = request_line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return respond(&mut stream, false, 400, "400 bad request\n", None);
    };
    if !version.starts_with("HTTP/1.") {
        return respond(&mut stream, false, 505, "505 only HTTP/1.x\n", None);
    }
    let head_only = method == "HEAD";
    match refusal(method, target) {
        Some((status, why)) => {
            let allow = (status == 405).then_some("GET, HEAD");
            respond(&mut stream, head_only, status, why, allow)
        }
        None => {
            let body = page.lock().unwrap_or_else(|p| p.into_inner()).clone();
            respond(&mut stream, head_only, 200, &body, None)
        }
    }
}

/// The request head (up to the empty line), or `None` when it is longer than [`MAX_HEAD`].
fn read_head(stream: &mut Timed) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// Where the request head in `bytes` ends: the line break before its empty line. Lines end in
/// CRLF, or in a bare LF, which RFC 9112 §2.2 lets a server take as a line's end (`printf
/// 'GET /metrics HTTP/1.1\n\n' | nc`, some scripts' clients).
fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i)
        .find(|&i| matches!(&bytes[i + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// What a request for anything but `/metrics` (`GET` or `HEAD`) is answered: its status and
/// why, or `None` for a request for the metrics.
fn refusal(method: &str, target: &str) -> Option<(u16, &'static str)> {
    // The absolute form (`http://host:9400/metrics`, what a request through a proxy names),
    // which a server must accept (RFC 9112 §3.2.2): its path.
    let origin = match target.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => {
            // The host ends at the path, a query or a fragment; no path is "/".
            match rest.find(['/', '?', '#']) {
                Some(at) if rest[at..].starts_with('/') => &rest[at..],
                _ => "/",
            }
        }
        _ => target,
    };
    let path = origin.split(['?', '#']).next().unwrap_or(origin);
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => None,
        (_, "/metrics") => Some((405, "405 method not allowed: GET /metrics\n")),
        _ => Some((404, "404 not found: atlasboost serves GET /metrics\n")),
    }
}

fn respond(
    stream: &mut Timed,
    head_only: bool,
    status: u16,
    body: &str,
    allow: Option<&str>,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "HTTP Version Not Supported",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: \
         close\r\n",
        if status == 200 {
            CONTENT_TYPE
        } else {
            "text/plain; charset=utf-8"
        },
        body.len()
    );
    if let Some(allow) = allow {
        head.push_str(&format!("Allow: {allow}\r\n"));
    }
    head.push_str("\r\n");
    // The answer's own time, from now.
    stream.until = Instant::now() + CLIENT_TIMEOUT;
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    // The answer is whole; the client sees the end of it at once. What it sent beyond its
    // request (a body, pipelined requests) is read and dropped for a moment before closing:
    // a close with unread bytes resets the connection, which can cost the client the answer.
    stream.stream.shutdown(Shutdown::Write)?;
    stream.until = Instant::now() + LINGER;
    let _ = io::copy(&mut stream.take(MAX_LINGER_BYTES), &mut io::sink());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(page: &str) -> (Server, Arc<Mutex<String>>) {
        let page = Arc::new(Mutex::new(page.to_string()));
        let server = Server::serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&page)).unwrap();
        (server, page)
    }

    /// One scrape: the whole reply, or the error that ended it (reads wait at most 20 s).
    fn scrape(address: SocketAddr) -> io::Result<String> {
        let mut s = TcpStream::connect(address)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)?;
        Ok(String::from_utf8_lossy(&reply).into_owned())
    }

    /// A client that asks and never reads (its answer far larger than the sockets' buffers)
    /// holds only its own connection: the next scrape is answered, whole.
    #[test]
    fn a_client_that_does_not_read_does_not_hold_up_the_others() {
        let big = "atlasboost_x 1\n".repeat(1 << 20);
        let (server, _) = serve(&big);
        let mut stalled = TcpStream::connect(server.address()).unwrap();
        for _ in 0..4 {
            stalled
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
        }
        // Long enough for the server to have started writing to it.
        std::thread::sleep(Duration::from_millis(200));
        let reply = scrape(server.address()).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{:.200}", reply);
        assert!(
            reply.contains("\r\nConnection: close\r\n"),
            "{:.200}",
            reply
        );
        assert!(reply.ends_with(&big), "the body came whole");
        drop(stalled);
    }

    /// Clients beyond [`MAX_CLIENTS`] at once are closed as they come, not queued behind the
    /// others; once those go, scrapes are answered again.
    #[test]
    fn clients_beyond_the_limit_are_closed_not_queued() {
        let (server, _) = serve("x 1\n");
        let silent: Vec<TcpStream> = (0..MAX_CLIENTS)
            .map(|_| TcpStream::connect(server.address()).unwrap())
            .collect();
        // Each silent client is being served (it holds a thread) before the next comes.
        std::thread::sleep(Duration::from_millis(300));
        let mut one_more = TcpStream::connect(server.address()).unwrap();
        one_more
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = Vec::new();
        // Closed (an end or a reset), not left waiting (the read's timeout) nor answered.
        match one_more.read_to_end(&mut got) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("expected the connection closed at once, got {other:?}, {got:?}"),
        }
        drop(silent);
        // Their threads see them go and end; then a scrape is answered (bounded: 10 s).
        let until = Instant::now() + Duration::from_secs(10);
        let answered = loop {
            match scrape(server.address()) {
                Ok(r) if r.starts_with("HTTP/1.1 200") => break true,
                _ if Instant::now() > until => break false,
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        assert!(
            answered,
            "scrapes are answered again once the silent clients go"
        );
    }

    /// HEAD gets the head alone; a request head past the limit, or not HTTP/1, is refused by
    /// status; what a POST sent is read and dropped, so its 405 arrives.
    #[test]
    fn heads_bodies_and_malformed_requests() {
        let (server, page) = serve("x 1\n");
        let ask = |request: &[u8]| {
            let mut s = TcpStream::connect(server.address()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(request).unwrap();
            let mut reply = Vec::new();
            s.read_to_end(&mut reply).unwrap();
            String::from_utf8_lossy(&reply).into_owned()
        };
        let head = ask(b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Length: 4\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
        let post = ask(b"POST /metrics HTTP/1.1\r\nContent-Length: 5000\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
        assert!(ask(long.as_bytes()).starts_with("HTTP/1.1 431 "));
        assert!(ask(b"GET /metrics\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(ask(b"GET /metrics HTTP/2.0\r\n\r\n").starts_with("HTTP/1.1 505 "));
        *page.lock().unwrap() = "y 2\n".into();
        assert!(ask(b"GET /metrics HTTP/1.0\r\n\r\n").ends_with("\r\n\r\ny 2\n"));
        // Lines that end in a bare LF (RFC 9112 §2.2), alone or mixed with CRLF.
        assert!(ask(b"GET /metrics HTTP/1.1\n\n").ends_with("\r\n\r\ny 2\n"));
        assert!(ask(b"GET /metrics HTTP/1.1\r\nHost: x\n\r\n").ends_with("\r\n\r\ny 2\n"));
        assert!(ask(b"GET /nothing HTTP/1.1\nHost: x\n\n").starts_with("HTTP/1.1 404 "));
        // The absolute form (RFC 9112 §3.2.2), as through a proxy.
        let absolute = ask(b"GET http://127.0.0.1:9400/metrics?x=1 HTTP/1.1\r\n\r\n");
        assert!(absolute.ends_with("\r\n\r\ny 2\n"), "{absolute}");
        assert!(ask(b"GET HTTP://h/metrics HTTP/1.1\r\n\r\n").ends_with("\r\n\r\ny 2\n"));
        assert!(ask(b"GET http://h/other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(ask(b"GET http://h HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(ask(b"GET http://h?x=/metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    }

    /// The head ends at its first empty line, whichever line ends it uses.
    #[test]
    fn the_head_ends_at_the_first_empty_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(15));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\n\r\nbody"), Some(20));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r"), None);
        assert_eq!(head_end(b""), None);
    }

    /// A client that drips its request a byte at a time (each read well within a socket
    /// timeout) is still cut off at the request's deadline, not served for ever.
    #[test]
    fn a_request_sent_a_byte_at_a_time_is_cut_off_at_its_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let dripping = std::thread::spawn(move || {
            let mut s = TcpStream::connect(address).unwrap();
            for _ in 0..100 {
                if s.write_all(b"G").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let started = Instant::now();
        let mut timed = Timed {
            stream,
            until: Instant::now() + Duration::from_millis(400),
        };
        let e = read_head(&mut timed).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        // Long before the 5 s the client would drip for.
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        drop(timed);
        dripping.join().unwrap();
    }

    /// Dropping the server closes its port.
    #[test]
    fn the_port_closes_when_the_server_goes() {
        let (server, _) = serve("x 1\n");
        let address = server.address();
        drop(server);
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(address).is_ok() {
            assert!(Instant::now() < until, "{address} still listens");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
