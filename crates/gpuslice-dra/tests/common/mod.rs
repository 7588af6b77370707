//! Test doubles of the driver's two peers: the kubelet and the API server.
#![allow(dead_code)]

pub mod fakeapi;
pub mod testkubelet;
