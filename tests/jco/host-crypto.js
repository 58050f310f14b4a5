// The component's host-crypto import, from JavaScript: not offered, so the guest
// verifies BLS signatures with its own code (the fallback every host can rely on).
export function offered() {
  return false;
}

export function verify() {
  throw new Error("host-crypto.verify called although offered() is false");
}

export function fastAggregateVerify() {
  throw new Error("host-crypto.fastAggregateVerify called although offered() is false");
}
