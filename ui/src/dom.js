// Tiny DOM helpers. Text always goes in as text (textContent / text nodes), never as HTML: file
// names, command lines, console output and metadata come from the guest or the tenant and are
// hostile. Nothing in the console uses innerHTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

function apply(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') {
      el.textContent = String(value);
    } else if (key === 'class') {
      el.setAttribute('class', value);
    } else if (key === 'testid') {
      el.setAttribute('data-testid', value);
    } else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'hidden' ||
               key === 'selected' || key === 'multiple') {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

// h('button', {class: 'x', testid: 'go', onClick: fn}, 'Go')
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  apply(el, props);
  append(el, children);
  return el;
}

export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, props);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replaceChildren(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

// A line of status text for a section: ok (muted), busy, or an error (red, role=alert).
export function statusLine(testid) {
  const el = h('p', { class: 'status', testid, role: 'status' });
  return {
    el,
    ok(text) { el.className = 'status'; el.textContent = text; el.removeAttribute('data-error'); },
    busy(text) { el.className = 'status busy'; el.textContent = text; el.removeAttribute('data-error'); },
    error(text) { el.className = 'status error'; el.textContent = text; el.setAttribute('data-error', ''); },
  };
}
