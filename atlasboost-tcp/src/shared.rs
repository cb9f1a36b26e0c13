//! One answer sent to many peers from one buffer.
//!
//! `zmq::Socket::send` copies its bytes into a new message each time, so answering N
//! participants would hold N copies of the answer in memory until they are written out (15 GB
//! for the all-gather of 4,096 hosts). ZeroMQ's `zmq_msg_copy` instead shares a large message's
//! buffer by reference count; the `zmq` crate does not wrap it, so this module does, over
//! `zmq-sys`.

use crate::TcpError;

/// A message whose buffer every send shares.
pub(crate) struct SharedMessage {
    msg: zmq_sys::zmq_msg_t,
}

impl SharedMessage {
    /// Copies `bytes` once into a new message.
    pub(crate) fn new(bytes: &[u8]) -> Result<SharedMessage, TcpError> {
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `msg` is a zmq_msg_t not yet initialised; zmq_msg_init_size initialises it
        // with a buffer of `bytes.len()` bytes, or fails and leaves nothing to release.
        let rc = unsafe { zmq_sys::zmq_msg_init_size(&mut msg, bytes.len()) };
        if rc != 0 {
            return Err(TcpError::Zmq {
                op: format!("allocate an answer of {} bytes", bytes.len()),
                source: zmq::Error::from_raw(zmq_sys::errno::ENOMEM),
            });
        }
        if !bytes.is_empty() {
            // SAFETY: the message was initialised above with exactly `bytes.len()` bytes,
            // which zmq_msg_data points to; the two buffers cannot overlap.
            unsafe {
                let data = zmq_sys::zmq_msg_data(&mut msg).cast::<u8>();
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len());
            }
        }
        Ok(SharedMessage { msg })
    }

    /// Sends `[routing, this message]` on a ROUTER socket, sharing the buffer. Returns false if
    /// the peer could not be sent to (it went away), which the caller ignores like any send.
    pub(crate) fn send_to(&mut self, socket: &mut zmq::Socket, routing: &[u8]) -> bool {
        let mut part = zmq_sys::zmq_msg_t::default();
        // SAFETY: `part` is initialised empty, then made a reference to `self.msg`'s buffer
        // (both are valid, initialised messages). If the copy fails, `part` is still a valid
        // empty message and is closed here.
        let copied = unsafe {
            zmq_sys::zmq_msg_init(&mut part);
            if zmq_sys::zmq_msg_copy(&mut part, &mut self.msg) != 0 {
                zmq_sys::zmq_msg_close(&mut part);
                false
            } else {
                true
            }
        };
        if !copied {
            return false;
        }
        if socket.send(routing, zmq::SNDMORE).is_err() {
            // SAFETY: `part` is a valid message that was not handed to ZeroMQ.
            unsafe { zmq_sys::zmq_msg_close(&mut part) };
            return false;
        }
        // SAFETY: `part` is a valid message and `socket.as_mut_ptr()` the live socket it is
        // sent on. On success ZeroMQ owns the message (and leaves `part` empty); on failure it
        // stays ours to close.
        unsafe {
            if zmq_sys::zmq_msg_send(&mut part, socket.as_mut_ptr(), 0) < 0 {
                zmq_sys::zmq_msg_close(&mut part);
                return false;
            }
        }
        true
    }
}

impl Drop for SharedMessage {
    fn drop(&mut self) {
        // SAFETY: `msg` was initialised in `new` and is closed exactly once, here; copies
        // already sent keep the buffer alive through its reference count.
        unsafe { zmq_sys::zmq_msg_close(&mut self.msg) };
    }
}
