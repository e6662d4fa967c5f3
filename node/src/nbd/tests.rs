//! The NBD server against a hand-driven client over real sockets, on a backend in
//! memory: the handshake, each command, and hostile input.

use super::*;
use std::sync::Mutex;
use tokio_real::io::{AsyncReadExt, AsyncWriteExt};

struct Memory {
    data: Mutex<Vec<u8>>,
    flushes: Mutex<u32>,
}

impl Backend for Memory {
    fn exports(&self) -> Vec<Export> {
        vec![
            Export {
                name: "disk".into(),
                size: self.data.lock().unwrap().len() as u64,
                key: None,
                locked: None,
                read_only: false,
                id: None,
            },
            Export {
                name: "other".into(),
                size: 4096,
                key: None,
                locked: None,
                read_only: false,
                id: None,
            },
            Export {
                name: "sealed".into(),
                size: 4096,
                key: None,
                locked: Some("no key here".into()),
                read_only: false,
                id: None,
            },
        ]
    }
    async fn read(&self, _: &Export, offset: u64, len: u32) -> Result<Bytes, u32> {
        let d = self.data.lock().unwrap();
        Ok(Bytes::copy_from_slice(
            &d[offset as usize..offset as usize + len as usize],
        ))
    }
    async fn write(&self, _: &Export, offset: u64, data: Bytes, _fua: bool) -> Result<(), u32> {
        let mut d = self.data.lock().unwrap();
        d[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        Ok(())
    }
    async fn flush(&self, _: &Export) -> Result<(), u32> {
        *self.flushes.lock().unwrap() += 1;
        Ok(())
    }
    async fn zero(&self, _: &Export, offset: u64, len: u32, _fua: bool) -> Result<(), u32> {
        let mut d = self.data.lock().unwrap();
        d[offset as usize..offset as usize + len as usize].fill(0);
        Ok(())
    }
}

async fn server() -> (std::net::SocketAddr, Arc<Memory>) {
    server_with(NbdTls::off()).await
}

async fn server_with(tls: NbdTls) -> (std::net::SocketAddr, Arc<Memory>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = Arc::new(Memory {
        data: Mutex::new(vec![0; 1 << 20]),
        flushes: Mutex::new(0),
    });
    tokio_real::spawn(serve(listener, backend.clone(), tls));
    (addr, backend)
}

/// Connect and read the server's greeting; send fixed-newstyle + no-zeroes.
async fn greet(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(s.read_u64().await.unwrap(), NBDMAGIC);
    assert_eq!(s.read_u64().await.unwrap(), IHAVEOPT);
    let flags = s.read_u16().await.unwrap();
    assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    s.write_u32(3).await.unwrap();
    s
}

async fn option(s: &mut TcpStream, option: u32, data: &[u8]) {
    s.write_u64(IHAVEOPT).await.unwrap();
    s.write_u32(option).await.unwrap();
    s.write_u32(data.len() as u32).await.unwrap();
    s.write_all(data).await.unwrap();
}

/// Read one option reply: (type, data).
async fn option_reply(s: &mut TcpStream, option: u32) -> (u32, Vec<u8>) {
    assert_eq!(s.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
    assert_eq!(s.read_u32().await.unwrap(), option);
    let kind = s.read_u32().await.unwrap();
    let len = s.read_u32().await.unwrap();
    let mut data = vec![0; len as usize];
    s.read_exact(&mut data).await.unwrap();
    (kind, data)
}

fn go_payload(name: &str) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&1u16.to_be_bytes());
    p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    p
}

/// Handshake with GO on `name`; returns the export size.
async fn go(s: &mut TcpStream, name: &str) -> u64 {
    option(s, OPT_GO, &go_payload(name)).await;
    let mut size = None;
    loop {
        let (kind, data) = option_reply(s, OPT_GO).await;
        match kind {
            REP_INFO if data[..2] == INFO_EXPORT.to_be_bytes() => {
                size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                let flags = u16::from_be_bytes(data[10..12].try_into().unwrap());
                assert_ne!(flags & TFLAG_CAN_MULTI_CONN, 0);
            }
            REP_INFO => {}
            REP_ACK => return size.expect("export info before ACK"),
            other => panic!("GO answered {other:#x}"),
        }
    }
}

async fn request(s: &mut TcpStream, command: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
    s.write_u32(REQUEST_MAGIC).await.unwrap();
    s.write_u16(flags).await.unwrap();
    s.write_u16(command).await.unwrap();
    s.write_u64(cookie).await.unwrap();
    s.write_u64(offset).await.unwrap();
    s.write_u32(len).await.unwrap();
}

/// Read a simple reply: (cookie, error).
async fn simple_reply(s: &mut TcpStream) -> (u64, u32) {
    assert_eq!(s.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    let error = s.read_u32().await.unwrap();
    let cookie = s.read_u64().await.unwrap();
    (cookie, error)
}

/// True once the server has closed the connection.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio_real::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf)).await
        {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio_real::test(crate = "tokio_real")]
async fn list_info_and_go_then_every_command() {
    let (addr, backend) = server().await;
    let mut s = greet(addr).await;
    option(&mut s, OPT_LIST, &[]).await;
    let mut names = Vec::new();
    loop {
        match option_reply(&mut s, OPT_LIST).await {
            (REP_SERVER, data) => names.push(String::from_utf8(data[4..].to_vec()).unwrap()),
            (REP_ACK, _) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(names, vec!["disk", "other", "sealed"]);
    option(&mut s, OPT_INFO, &go_payload("nope")).await;
    assert_eq!(option_reply(&mut s, OPT_INFO).await.0, REP_ERR_UNKNOWN);
    // A volume that cannot be opened here says why.
    option(&mut s, OPT_GO, &go_payload("sealed")).await;
    let (kind, why) = option_reply(&mut s, OPT_GO).await;
    assert_eq!((kind, &why[..]), (REP_ERR_POLICY, &b"no key here"[..]));
    option(&mut s, OPT_INFO, &[0, 0, 0, 9, 1]).await;
    assert_eq!(option_reply(&mut s, OPT_INFO).await.0, REP_ERR_INVALID);
    option(&mut s, 8, &[]).await; // STRUCTURED_REPLY: not offered
    assert_eq!(option_reply(&mut s, 8).await.0, REP_ERR_UNSUP);
    option(&mut s, 99, &vec![7; 10_000]).await; // too big, skipped
    assert_eq!(option_reply(&mut s, 99).await.0, REP_ERR_TOO_BIG);
    assert_eq!(go(&mut s, "disk").await, 1 << 20);

    // WRITE with FUA, then READ it back.
    request(&mut s, CMD_WRITE, CMD_FLAG_FUA, 1, 8192, 4096).await;
    s.write_all(&[0xab; 4096]).await.unwrap();
    assert_eq!(simple_reply(&mut s).await, (1, 0));
    request(&mut s, CMD_READ, 0, 2, 8192, 4096).await;
    assert_eq!(simple_reply(&mut s).await, (2, 0));
    let mut data = vec![0; 4096];
    s.read_exact(&mut data).await.unwrap();
    assert!(data.iter().all(|&b| b == 0xab));
    // WRITE_ZEROES, TRIM, FLUSH.
    request(&mut s, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 3, 8192, 1024).await;
    assert_eq!(simple_reply(&mut s).await, (3, 0));
    request(&mut s, CMD_TRIM, 0, 4, 9216, 1024).await;
    assert_eq!(simple_reply(&mut s).await, (4, 0));
    request(&mut s, CMD_FLUSH, 0, 5, 0, 0).await;
    assert_eq!(simple_reply(&mut s).await, (5, 0));
    assert_eq!(*backend.flushes.lock().unwrap(), 1);
    {
        let d = backend.data.lock().unwrap();
        assert!(d[8192..10240].iter().all(|&b| b == 0));
        assert!(d[10240..12288].iter().all(|&b| b == 0xab));
    }
    // Errors that leave the connection up: a write past the end, an unknown
    // command, FUA on a read (accepted, meaningless).
    request(&mut s, CMD_WRITE, 0, 7, 1 << 20, 512).await;
    s.write_all(&[1; 512]).await.unwrap();
    assert_eq!(simple_reply(&mut s).await, (7, errno::ENOSPC));
    request(&mut s, 42, 0, 8, 0, 0).await;
    assert_eq!(simple_reply(&mut s).await, (8, errno::EINVAL));
    request(&mut s, CMD_READ, CMD_FLAG_FUA, 9, 0, 512).await;
    assert_eq!(simple_reply(&mut s).await, (9, 0));
    let mut data = vec![0; 512];
    s.read_exact(&mut data).await.unwrap();
    // A failed READ: its error reply, then the connection closes (a simple
    // reply cannot stand in for the data the client expects).
    request(&mut s, CMD_READ, 0x80, 10, 0, 512).await;
    assert_eq!(simple_reply(&mut s).await, (10, errno::EINVAL));
    assert!(closed(&mut s).await);
    for (cookie, offset) in [(11, (1 << 20) - 512), (12, u64::MAX - 10)] {
        let mut s = greet(addr).await;
        go(&mut s, "disk").await;
        request(&mut s, CMD_READ, 0, cookie, offset, 1024).await;
        assert_eq!(simple_reply(&mut s).await, (cookie, errno::EINVAL));
        assert!(closed(&mut s).await);
    }
    // DISC closes after the replies.
    let mut s = greet(addr).await;
    go(&mut s, "disk").await;
    request(&mut s, CMD_FLUSH, 0, 13, 0, 0).await;
    request(&mut s, CMD_DISC, 0, 14, 0, 0).await;
    assert_eq!(simple_reply(&mut s).await, (13, 0));
    assert!(closed(&mut s).await);
}

#[tokio_real::test(crate = "tokio_real")]
async fn hostile_clients_are_disconnected_and_others_go_on() {
    let (addr, _backend) = server().await;
    let mut good = greet(addr).await;
    go(&mut good, "disk").await;

    // A 4 GiB write (its payload would follow) is a disconnect.
    let mut huge = greet(addr).await;
    go(&mut huge, "disk").await;
    request(&mut huge, CMD_WRITE, 0, 1, 0, u32::MAX).await;
    assert!(closed(&mut huge).await);
    // A 4 GiB read gets EINVAL, then the connection closes.
    let mut big_read = greet(addr).await;
    go(&mut big_read, "disk").await;
    request(&mut big_read, CMD_READ, 0, 1, 0, u32::MAX).await;
    assert_eq!(simple_reply(&mut big_read).await, (1, errno::EINVAL));
    assert!(closed(&mut big_read).await);
    // A client that floods reads and never reads its replies is held back by the
    // budget (the server stops reading its requests), not by the server's memory:
    // the good client below is still served.
    let mut flood = greet(addr).await;
    go(&mut flood, "disk").await;
    for cookie in 0..2000 {
        request(&mut flood, CMD_READ, 0, cookie, 0, 512 << 10).await;
    }
    // Garbage instead of a request.
    let mut garbage = greet(addr).await;
    go(&mut garbage, "disk").await;
    garbage.write_all(&[0x55; 64]).await.unwrap();
    assert!(closed(&mut garbage).await);
    // Garbage in the handshake.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_all(&[0xff; 32]).await.unwrap();
    assert!(closed(&mut s).await);
    // A truncated request, then the client goes away.
    let mut cut = greet(addr).await;
    go(&mut cut, "disk").await;
    cut.write_all(&REQUEST_MAGIC.to_be_bytes()).await.unwrap();
    drop(cut);
    // An unknown export with the old EXPORT_NAME option: closed; and one
    // that cannot be opened here (GO says why) is not opened that way either.
    for name in [&b"missing"[..], b"sealed"] {
        let mut old = greet(addr).await;
        option(&mut old, OPT_EXPORT_NAME, name).await;
        assert!(closed(&mut old).await);
    }

    // The good client is still served.
    request(&mut good, CMD_WRITE, 0, 7, 0, 4096).await;
    good.write_all(&[9; 4096]).await.unwrap();
    assert_eq!(simple_reply(&mut good).await, (7, 0));
}

#[tokio_real::test(crate = "tokio_real")]
async fn export_name_and_abort_work_too() {
    let (addr, _backend) = server().await;
    let mut s = greet(addr).await;
    option(&mut s, OPT_EXPORT_NAME, b"other").await;
    assert_eq!(s.read_u64().await.unwrap(), 4096);
    let flags = s.read_u16().await.unwrap();
    assert_ne!(flags & TFLAG_HAS_FLAGS, 0);
    request(&mut s, CMD_READ, 0, 1, 0, 4096).await;
    assert_eq!(simple_reply(&mut s).await, (1, 0));

    let mut a = greet(addr).await;
    option(&mut a, OPT_ABORT, &[]).await;
    assert_eq!(option_reply(&mut a, OPT_ABORT).await.0, REP_ACK);
    assert!(closed(&mut a).await);
}

/// A server certificate for 127.0.0.1, self-signed (the server side only).
fn self_signed() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio_real::test(crate = "tokio_real")]
async fn starttls_on_a_server_without_tls_is_unsupported_and_plain_nbd_goes_on() {
    let (addr, _) = server().await;
    let mut s = greet(addr).await;
    option(&mut s, OPT_STARTTLS, &[]).await;
    assert_eq!(option_reply(&mut s, OPT_STARTTLS).await.0, REP_ERR_UNSUP);
    assert_eq!(go(&mut s, "disk").await, 1 << 20);
}

#[tokio_real::test(crate = "tokio_real")]
async fn a_server_that_requires_tls_answers_nothing_else_before_it() {
    let (cert, key) = self_signed();
    let tls = NbdTls::new(cert.as_bytes(), key.as_bytes(), None, true).unwrap();
    let (addr, _) = server_with(tls).await;
    let mut s = greet(addr).await;
    for (opt, data) in [
        (OPT_LIST, vec![]),
        (OPT_INFO, go_payload("disk")),
        (OPT_GO, go_payload("disk")),
    ] {
        option(&mut s, opt, &data).await;
        assert_eq!(
            option_reply(&mut s, opt).await.0,
            REP_ERR_TLS_REQD,
            "option {opt}"
        );
    }
    // STARTTLS with data is refused; then ABORT is still answered.
    option(&mut s, OPT_STARTTLS, b"x").await;
    assert_eq!(option_reply(&mut s, OPT_STARTTLS).await.0, REP_ERR_INVALID);
    option(&mut s, OPT_ABORT, &[]).await;
    assert_eq!(option_reply(&mut s, OPT_ABORT).await.0, REP_ACK);
    // EXPORT_NAME has no error reply: the connection closes.
    let mut s = greet(addr).await;
    option(&mut s, OPT_EXPORT_NAME, b"disk").await;
    assert!(closed(&mut s).await);
    // STARTTLS is acknowledged, and what follows is a TLS handshake: a
    // client that sends plain options instead gets no option reply.
    let mut s = greet(addr).await;
    option(&mut s, OPT_STARTTLS, &[]).await;
    assert_eq!(option_reply(&mut s, OPT_STARTTLS).await.0, REP_ACK);
    option(&mut s, OPT_LIST, &[]).await;
    let mut back = Vec::new();
    let _ = tokio_real::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut back))
        .await
        .expect("the server closes the connection");
    assert!(
        back.is_empty() || back[0] == 21,
        "a TLS alert at most: {back:?}"
    );
}
