// Calls to the API with the signed-in token as a bearer header; errors as the API says them.

const KEY = "fanline-token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

/** An error answer: its status, and the API's own code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

/** Reads an error answer's `{"error":{"code","message"}}`, or says what came instead. */
export async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch {
    // Not JSON: keep the status line.
  }
  return new ApiError(response.status, code, message);
}

export function authHeaders(extra = {}) {
  const headers = { ...extra };
  const value = token();
  if (value) headers.Authorization = `Bearer ${value}`;
  return headers;
}

/** `method path` with an optional JSON body; the parsed answer, null for a 204. */
export async function api(method, path, body) {
  const init = { method, headers: authHeaders() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorOf(response);
  if (response.status === 204) return null;
  return response.json();
}

/** A path segment: names may hold `/` and other reserved characters. */
export function seg(name) {
  return encodeURIComponent(name);
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
