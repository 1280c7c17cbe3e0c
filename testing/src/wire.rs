//! Wire-format checks of gRPC messages against bytes written by hand from the upstream field
//! numbers and types (the `wire` tests of `kubelet-proto` and `akri-proto`).

use prost::Message;

/// Encodes `msg`, compares with `expected`, decodes `expected` and compares with `msg`.
pub fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, expected: &[u8]) {
    assert_eq!(msg.encode_to_vec(), expected, "encoding of {msg:?}");
    assert_eq!(&M::decode(expected).expect("decodes"), msg);
}

/// A length-delimited field: tag byte, one-byte length, payload.
pub fn ld(tag: u8, payload: &[u8]) -> Vec<u8> {
    assert!(
        payload.len() < 128,
        "test payloads stay below one length byte"
    );
    [&[tag, payload.len() as u8][..], payload].concat()
}
