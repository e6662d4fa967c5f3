//! The NBD handshake: the server's greeting, the client's options (STARTTLS,
//! EXPORT_NAME, LIST, INFO and GO, ABORT) and their replies, up to the
//! export a client goes on to transmission with.

use super::*;

/// The handshake; `Some` (the export, and the connection's halves, TLS or not)
/// to go on to transmission, `None` if the client ended it (ABORT).
pub(super) async fn handshake<B: Backend>(
    mut r: Reader,
    mut w: Writer,
    backend: &B,
    tls: &NbdTls,
) -> Result<Option<(Export, Reader, Writer)>, ConnError> {
    let mut secured = false;
    let no_zeroes = greet(&mut r, &mut w).await?;
    loop {
        let Some((option, data)) = read_option(&mut r, &mut w).await? else {
            continue; // Too large: skipped and answered.
        };
        if tls.require && !secured && option != OPT_STARTTLS && option != OPT_ABORT {
            refuse_before_tls(&mut w, option).await?;
            continue;
        }
        match option {
            OPT_STARTTLS => {
                let refusal: Option<&[u8]> = if !data.is_empty() {
                    Some(b"STARTTLS takes no data")
                } else if secured {
                    Some(b"TLS is already on")
                } else {
                    None
                };
                match (&tls.acceptor, refusal) {
                    (_, Some(why)) => reply(&mut w, option, REP_ERR_INVALID, why).await?,
                    (None, None) => {
                        reply(&mut w, option, REP_ERR_UNSUP, b"this server has no TLS").await?
                    }
                    (Some(acceptor), None) => {
                        (r, w) = start_tls(r, w, acceptor).await?;
                        secured = true;
                        continue;
                    }
                }
            }
            OPT_EXPORT_NAME => {
                let export = export_name(&mut w, backend, &data, no_zeroes).await?;
                return Ok(Some((export, r, w)));
            }
            OPT_ABORT => {
                reply(&mut w, option, REP_ACK, &[]).await?;
                w.flush().await?;
                return Ok(None);
            }
            OPT_LIST => list(&mut w, backend, &data).await?,
            OPT_INFO | OPT_GO => {
                if let Some(export) = info(&mut w, backend, option, &data).await? {
                    w.flush().await?;
                    return Ok(Some((export, r, w)));
                }
            }
            _ => reply(&mut w, option, REP_ERR_UNSUP, &[]).await?,
        }
        w.flush().await?;
    }
}

/// Answer `option`, asked before STARTTLS of a server that requires TLS:
/// TLS is required (an EXPORT_NAME has no error reply: the protocol says to
/// close).
async fn refuse_before_tls(w: &mut Writer, option: u32) -> Result<(), ConnError> {
    if option == OPT_EXPORT_NAME {
        return Err(ConnError::Protocol(
            "NBD_OPT_EXPORT_NAME before STARTTLS on a server that requires TLS".into(),
        ));
    }
    reply(
        w,
        option,
        REP_ERR_TLS_REQD,
        b"TLS is required: NBD_OPT_STARTTLS",
    )
    .await?;
    w.flush().await?;
    Ok(())
}

/// The server's greeting, and the client's flags: whether it asked for no
/// zeroes after an export's flags.
async fn greet(r: &mut Reader, w: &mut Writer) -> Result<bool, ConnError> {
    w.write_u64(NBDMAGIC).await?;
    w.write_u64(IHAVEOPT).await?;
    w.write_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).await?;
    w.flush().await?;
    let client_flags = r.read_u32().await?;
    if client_flags & !CLIENT_FLAGS_KNOWN != 0 || client_flags & 1 == 0 {
        return Err(ConnError::Protocol(format!(
            "client flags {client_flags:#x}"
        )));
    }
    Ok(client_flags & 2 != 0)
}

/// The client's next option and its data; `None` for one too large, which
/// was skipped (in bounded memory) and answered.
async fn read_option(r: &mut Reader, w: &mut Writer) -> Result<Option<(u32, Vec<u8>)>, ConnError> {
    let magic = r.read_u64().await?;
    if magic != IHAVEOPT {
        return Err(ConnError::Protocol(format!("option magic {magic:#x}")));
    }
    let option = r.read_u32().await?;
    let len = r.read_u32().await?;
    if len > MAX_OPTION {
        if option == OPT_EXPORT_NAME || len > MAX_IO {
            // No error reply exists for EXPORT_NAME; and a huge payload is not
            // worth reading. The spec allows closing here.
            return Err(ConnError::Protocol(format!(
                "option {option} of {len} bytes"
            )));
        }
        let skipped = tokio_real::io::copy(
            &mut (&mut *r).take(u64::from(len)),
            &mut tokio_real::io::sink(),
        )
        .await?;
        if skipped != u64::from(len) {
            return Err(ConnError::Protocol("option payload cut short".into()));
        }
        reply(w, option, REP_ERR_TOO_BIG, b"option payload too large").await?;
        w.flush().await?;
        return Ok(None);
    }
    let mut data = vec![0; len as usize];
    r.read_exact(&mut data).await?;
    Ok(Some((option, data)))
}

/// Say yes to STARTTLS and run the TLS handshake: the connection's halves
/// inside TLS, where option haggling starts again (nothing negotiated before
/// it carries over).
async fn start_tls(
    r: Reader,
    mut w: Writer,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> Result<(Reader, Writer), ConnError> {
    reply(&mut w, OPT_STARTTLS, REP_ACK, &[]).await?;
    w.flush().await?;
    // The client starts TLS only after the ACK: anything already buffered is
    // a protocol violation.
    if !r.buffer().is_empty() {
        return Err(ConnError::Protocol(
            "data after NBD_OPT_STARTTLS before the TLS handshake".into(),
        ));
    }
    let stream = r.into_inner().unsplit(w.into_inner());
    let secure = acceptor.accept(stream).await?;
    Ok(halves(Box::new(secure)))
}

/// NBD_OPT_EXPORT_NAME for export `data`: the export, its size and flags
/// sent. It has no error reply: an unknown volume, or one that cannot be
/// opened here, ends the connection, with its reason logged.
async fn export_name<B: Backend>(
    w: &mut Writer,
    backend: &B,
    data: &[u8],
    no_zeroes: bool,
) -> Result<Export, ConnError> {
    let name = String::from_utf8_lossy(data);
    let Some(export) = find(backend, &name) else {
        return Err(ConnError::Protocol(format!("unknown export {name:?}")));
    };
    if let Some(why) = &export.locked {
        return Err(ConnError::Protocol(why.clone()));
    }
    w.write_u64(export.size).await?;
    w.write_u16(transmission_flags(&export)).await?;
    if !no_zeroes {
        w.write_all(&[0; 124]).await?;
    }
    w.flush().await?;
    Ok(export)
}

/// NBD_OPT_LIST: every export's name.
async fn list<B: Backend>(w: &mut Writer, backend: &B, data: &[u8]) -> Result<(), ConnError> {
    if !data.is_empty() {
        reply(w, OPT_LIST, REP_ERR_INVALID, b"LIST takes no data").await?;
        return Ok(());
    }
    for e in backend.exports() {
        let mut body = (e.name.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(e.name.as_bytes());
        reply(w, OPT_LIST, REP_SERVER, &body).await?;
    }
    reply(w, OPT_LIST, REP_ACK, &[]).await?;
    Ok(())
}

/// NBD_OPT_INFO or NBD_OPT_GO (`option`) for the export `data` names: its
/// size, flags and block sizes, or why not. The export, for a GO answered.
async fn info<B: Backend>(
    w: &mut Writer,
    backend: &B,
    option: u32,
    data: &[u8],
) -> Result<Option<Export>, ConnError> {
    let name = match parse_info_request(data) {
        Err(msg) => {
            reply(w, option, REP_ERR_INVALID, msg.as_bytes()).await?;
            return Ok(None);
        }
        Ok((name, _requests)) => name,
    };
    let export = match find(backend, &name) {
        None => {
            let msg = format!("no volume named {name:?}");
            reply(w, option, REP_ERR_UNKNOWN, msg.as_bytes()).await?;
            return Ok(None);
        }
        Some(Export {
            locked: Some(why), ..
        }) => {
            reply(w, option, REP_ERR_POLICY, why.as_bytes()).await?;
            return Ok(None);
        }
        Some(export) => export,
    };
    let mut info = INFO_EXPORT.to_be_bytes().to_vec();
    info.extend_from_slice(&export.size.to_be_bytes());
    info.extend_from_slice(&transmission_flags(&export).to_be_bytes());
    reply(w, option, REP_INFO, &info).await?;
    // Always sent: clients that did not ask may ignore it. Minimum and
    // preferred 1: clients such as nbdfuse pass on unaligned I/O, and libnbd
    // refuses requests below an advertised minimum.
    let mut sizes = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    sizes.extend_from_slice(&1u32.to_be_bytes());
    sizes.extend_from_slice(&1u32.to_be_bytes());
    sizes.extend_from_slice(&MAX_IO.to_be_bytes());
    reply(w, option, REP_INFO, &sizes).await?;
    reply(w, option, REP_ACK, &[]).await?;
    Ok((option == OPT_GO).then_some(export))
}

/// Parse an INFO/GO payload: name length, name, request count, requests.
fn parse_info_request(data: &[u8]) -> Result<(String, Vec<u16>), &'static str> {
    let name_len = data.get(..4).ok_or("short payload")?;
    let name_len = u32::from_be_bytes(name_len.try_into().expect("4 bytes")) as usize;
    let name = data.get(4..4 + name_len).ok_or("name past the payload")?;
    let name = std::str::from_utf8(name).map_err(|_| "name is not UTF-8")?;
    let rest = &data[4 + name_len..];
    let count = rest.get(..2).ok_or("no request count")?;
    let count = u16::from_be_bytes(count.try_into().expect("2 bytes")) as usize;
    let list = &rest[2..];
    if list.len() != count * 2 {
        return Err("request count does not match the payload");
    }
    let requests = list
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Ok((name.to_string(), requests))
}

fn find<B: Backend>(backend: &B, name: &str) -> Option<Export> {
    backend.exports().into_iter().find(|e| e.name == name)
}

async fn reply(w: &mut Writer, option: u32, kind: u32, data: &[u8]) -> std::io::Result<()> {
    w.write_u64(OPT_REPLY_MAGIC).await?;
    w.write_u32(option).await?;
    w.write_u32(kind).await?;
    w.write_u32(data.len() as u32).await?;
    w.write_all(data).await
}
