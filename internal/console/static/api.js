// The operator API, called with the API token the operator typed in.
// The token lives in sessionStorage (this tab's session) and goes only in
// the Authorization header, never in a URL.

const KEY = 'postbox.token';

export function token() { return sessionStorage.getItem(KEY) || ''; }
export function forget() { sessionStorage.removeItem(KEY); }

// APIError is an answer of the API other than 2xx: its status, code and message.
export class APIError extends Error {
  constructor(status, code, message) {
    super(message || code || ('HTTP ' + status));
    this.status = status;
    this.code = code;
  }
}

let asking = null; // one prompt for every request that got 401 meanwhile

// askToken shows the token dialog and resolves once a token was entered.
function askToken(wrong) {
  if (asking) return asking;
  const dlg = document.getElementById('token-dialog');
  const form = document.getElementById('token-form');
  const input = document.getElementById('token-input');
  const err = document.getElementById('token-error');
  err.hidden = !wrong;
  err.textContent = wrong ? 'The server refused that token.' : '';
  input.value = '';
  asking = new Promise((resolve) => {
    const done = (e) => {
      e.preventDefault();
      const v = input.value.trim();
      if (!v) return;
      sessionStorage.setItem(KEY, v);
      form.removeEventListener('submit', done);
      dlg.close();
      asking = null;
      document.dispatchEvent(new CustomEvent('postbox-token'));
      resolve();
    };
    form.addEventListener('submit', done);
    dlg.addEventListener('cancel', (e) => e.preventDefault()); // no data without a token
  });
  dlg.showModal();
  input.focus();
  return asking;
}

// api calls the API at path (method and JSON body optional) and resolves
// with the decoded JSON (null for 204). A 401 asks for the token and tries
// again; another error rejects with an APIError.
export async function api(path, { method = 'GET', body } = {}) {
  for (;;) {
    const headers = { Accept: 'application/json' };
    const t = token();
    if (t) headers.Authorization = 'Bearer ' + t;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit', cache: 'no-store',
    });
    if (res.status === 401) {
      await askToken(t !== '');
      continue;
    }
    if (res.status === 204) return null;
    let data = null;
    try { data = await res.json(); } catch { /* not JSON */ }
    if (!res.ok) {
      const e = (data && data.error) || {};
      throw new APIError(res.status, e.code, e.message);
    }
    return data;
  }
}

// q builds a query string from the non-empty values of params.
export function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') s.set(k, v);
  }
  const out = s.toString();
  return out ? '?' + out : '';
}
