@0xaa516dd64b13986f;
# ExaServe public RPC API (being written).
struct Placeholder {
  unused @0 :Bool;  # removed once the Gateway and Admin interfaces land
}
