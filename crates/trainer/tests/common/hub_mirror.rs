//! A mirror of the Hugging Face Hub on loopback, the few routes `hf-hub` calls: a model's
//! listing (`/api/models/<name>/revision/<rev>`) and its files by range
//! (`/<name>/resolve/<rev>/<file>`, with the `ETag`, `X-Repo-Commit` and `Content-Range` the
//! client reads). Anything else is 404. It counts the requests it answered.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A running mirror of one model; it serves until the test process ends.
pub(crate) struct HubMirror {
    /// `http://127.0.0.1:<port>`, for `HF_ENDPOINT`.
    pub(crate) endpoint: String,
    requests: Arc<AtomicUsize>,
}

impl HubMirror {
    /// Serves the files of `folder` as model `name` at commit `commit` of branch `main`.
    pub(crate) fn serve(folder: PathBuf, name: &str, commit: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let (name, commit, counted) = (name.to_string(), commit.to_string(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                answer(stream, &folder, &name, &commit);
            }
        });
        HubMirror { endpoint, requests }
    }

    /// Requests answered so far.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn answer(mut stream: TcpStream, folder: &std::path::Path, name: &str, commit: &str) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_string());
    }
    let path = head.first().and_then(|l| l.split(' ').nth(1)).unwrap_or("").to_string();
    // `Range: bytes=<first>-[<last>]`: the client asks for byte 0 alone (its metadata request),
    // then from where its file ends.
    let range = head.iter().find_map(|h| h.to_ascii_lowercase().strip_prefix("range: bytes=").map(str::to_string));
    let (first, last) = match range.as_deref().and_then(|r| r.split_once('-')) {
        Some((first, last)) => (first.parse::<usize>().unwrap_or(0), last.parse::<usize>().ok()),
        None => (0, None),
    };
    let files: Vec<String> = std::fs::read_dir(folder)
        .expect("model folder")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let (status, headers, body) = if path == format!("/api/models/{name}/revision/main") {
        let siblings: Vec<_> = files.iter().map(|f| serde_json::json!({ "rfilename": f })).collect();
        let listing = serde_json::json!({ "sha": commit, "siblings": siblings });
        ("200 OK", String::new(), listing.to_string().into_bytes())
    } else if let Some(bytes) = path
        .strip_prefix(&format!("/{name}/resolve/main/"))
        .filter(|f| files.iter().any(|n| n == f))
        .and_then(|f| std::fs::read(folder.join(f)).ok())
    {
        let etag = format!("{:x}", Sha256::digest(&bytes));
        let start = first.min(bytes.len());
        let end = last.map_or(bytes.len(), |l| (l + 1).min(bytes.len())).max(start);
        let headers = format!(
            "ETag: \"{etag}\"\r\nX-Repo-Commit: {commit}\r\nContent-Range: bytes {start}-{}/{}\r\n",
            end.max(1) - 1,
            bytes.len()
        );
        ("206 Partial Content", headers, bytes[start..end].to_vec())
    } else {
        ("404 Not Found", String::new(), b"Repository not found".to_vec())
    };
    let reply = format!("HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let _ = stream.write_all(reply.as_bytes()).and_then(|()| stream.write_all(&body));
}
