"""Documents a client attaches (Anthropic's `document` block, OpenAI's `file` and `input_file` parts) reach the
model as text: a PDF's read by pypdf, what cannot be read as a note. The PDFs are written here by hand."""
from __future__ import annotations

import base64
import io
import threading

import anthropic
import openai
import pypdf
import pytest
from aiohttp.test_utils import TestClient

from proxy.dialects import anthropic as anthropic_dialect
from proxy.dialects import documents
from tests.fakes import FakeOpenAI


def pdf(*pages: str) -> bytes:
    """A minimal PDF, a page for each string; an empty string is a page with no text, as a scan reads."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 712 Td ({text}) Tj ET".encode() if text else b""
        objs.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                    b"/Resources << /Font << /F1 3 0 R >> >> >>" % len(objs))
        kids.append(len(objs))
    objs[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return bytes(out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_pdf_reads_as_its_pages_text_with_a_note_for_pages_without_any():
    assert documents.pdf_text(b64(pdf("Velo listens on 8000.", "", "", "The end."))) == \
        "Velo listens on 8000.\n\n[pages 2-3: no text to read]\n\nThe end."


@pytest.mark.parametrize("data, bounds, expected", [
    (b64(pdf("", "")), {}, "[a PDF left out: no text in its 2 pages (scanned, or pictures)]"),
    (b64(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog"), {}, "[a PDF left out: it could not be read (PdfStreamError)]"),
    ("not base64!", {}, "[a PDF left out: its data is not valid base64]"),
    (b64(pdf("one", "two", "three")), {"MAX_PAGES": 2},
     "one\n\ntwo\n\n[page 3 left out: Velo reads the first 2 pages of a PDF]"),
    (b64(pdf("big")), {"MAX_PDF_BYTES": 100}, "[a PDF left out: over the 0 MB Velo reads]"),
    (b64(pdf("slow", "slower")), {"MAX_SECONDS": -1.0},
     "[pages 1-2 left out: reading the pages before took over -1 s]"),
])
def test_what_cannot_be_read_is_a_note_not_an_error(monkeypatch, data, bounds, expected):
    """A scan, a broken file, bad base64, a PDF past the bounds: a note the model reads, so the conversation goes on
    (the history brings the PDF again every turn, and a 400 would fail them all)."""
    for name, value in bounds.items():
        monkeypatch.setattr(documents, name, value)
    assert documents.pdf_text(data) == expected


@pytest.mark.parametrize("user_password, expected", [("", "Locked for printing only."),
                                                     ("open-sesame", "[a PDF left out: it is encrypted]")])
def test_an_aes_encrypted_pdf_reads_where_it_opens_without_a_password(user_password, expected):
    """A PDF that restricts printing or copying is encrypted (AES, as Acrobat writes it) with an empty user password:
    it opens for anyone, and pypdf reads it with `cryptography` (pyproject's pypdf[crypto]); one that needs a password
    is a note."""
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(pdf("Locked for printing only."))))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    assert documents.pdf_text(b64(out.getvalue())) == expected


async def test_a_large_pdf_is_read_on_a_thread_once(monkeypatch):
    """Reading a PDF takes pypdf about a millisecond a page: one past INLINE_CHARS is read off the event loop, on the
    reader's own threads, and once only, since the history brings it again every turn."""
    small, large = b64(pdf("A short one.")), b64(pdf(*(f"Page {n} of the large one." for n in range(40))))
    assert len(small) <= documents.INLINE_CHARS < len(large)
    threads, read = [], documents._read
    monkeypatch.setattr(documents, "_read", lambda d: threads.append(threading.current_thread().name) or read(d))
    reader = documents.Documents()
    for data in (small, large, large):
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}]}]}
        parsed = await reader.parse(anthropic_dialect.parse_messages, body)
        assert parsed.request.messages[0].content.startswith(("A short one.", "Page 0 of the large one.\n\nPage 1"))
    reader.close()
    assert threads == [threading.main_thread().name, "velo-documents_0"]


async def test_a_large_bodys_parse_runs_on_a_thread_and_reads_its_pdfs_there(monkeypatch):
    """A large body's parse runs on the reader's threads from the start (http_io.parse_body): a PDF in it is read
    there, even a short one, and kept for the turns after, which find it without reading it again."""
    threads, read = [], documents._read
    monkeypatch.setattr(documents, "_read", lambda d: threads.append(threading.current_thread().name) or read(d))
    reader = documents.Documents()
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": b64(pdf("A short one."))}}]}]}
    for apart in (True, False):
        parsed = await reader.parse(anthropic_dialect.parse_messages, body, apart=apart)
        assert parsed.request.messages[0].content.startswith("A short one.")
    reader.close()
    assert threads == ["velo-documents_0"]


async def test_anthropic_pdf_documents_reach_the_backend_as_text(served: tuple[TestClient, FakeOpenAI]):
    """Claude Code's Read of a PDF: a base64 `document` in a user turn or a tool result; before, a 400 "only
    plain-text documents are supported" on that turn and every later one. A URL is a note: Velo fetches nothing."""
    client, up = served
    sdk = anthropic.AsyncAnthropic(base_url=str(client.make_url("")).rstrip("/"), api_key="k", max_retries=0)
    doc = {"type": "document", "title": "report.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf("Revenue grew 12%."))}}
    url = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Read it."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [doc]}]},
        {"role": "user", "content": [{"type": "text", "text": "And these:"}, doc, url]}]
    await sdk.messages.create(model="m", max_tokens=8, messages=messages)
    sent = up.last("/v1/chat/completions")["messages"]
    assert sent[2]["content"] == "report.pdf\n\nRevenue grew 12%."
    assert sent[3]["content"] == ("And these:\n\nreport.pdf\n\nRevenue grew 12%.\n\n"
                                  "[the document at https://example.com/a.pdf left out: Velo fetches no URLs]\n\n")
    as_text = {"type": "document", "title": "report.pdf", "source": {"type": "text", "data": "Revenue grew 12%."}}
    counted = [await sdk.messages.count_tokens(model="m", messages=[{"role": "user", "content": [d]}])
               for d in (doc, as_text)]
    assert counted[0].input_tokens == counted[1].input_tokens  # what is sent, counted


async def test_openai_file_parts_reach_the_backend_as_text(served: tuple[TestClient, FakeOpenAI]):
    """A chat `file` part and a Responses `input_file` part (in a message and in a tool's output), as the openai
    package sends a PDF: its text, read as Anthropic's documents are; before, a 400 "unsupported content part type
    'file'" (chat) and "parts of type 'input_file' are not supported" (Responses; in a tool's output, dropped)."""
    client, up = served
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="k", max_retries=0)
    data = "data:application/pdf;base64," + b64(pdf("Churn fell to 3%."))
    await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Summarize:"}, {"type": "file", "file": {"filename": "q3.pdf", "file_data": data}},
        {"type": "file", "file": {"file_id": "file-abc"}}]}])
    assert up.last("/v1/chat/completions")["messages"][0]["content"] == (
        "Summarize:\n\nq3.pdf\n\nChurn fell to 3%.\n\n[the file file-abc left out: Velo keeps no uploaded files]\n\n")
    await sdk.responses.create(model="m", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Summarize:"},
                                     {"type": "input_file", "filename": "q3.pdf", "file_data": data}]},
        {"type": "function_call", "call_id": "c1", "name": "fetch", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "Fetched."}, {"type": "input_file", "file_url": "https://x.org/a.pdf"}]}])
    sent = up.last("/v1/chat/completions")["messages"]
    assert sent[0]["content"] == "Summarize:\n\nq3.pdf\n\nChurn fell to 3%.\n\n"
    assert sent[2]["content"] == "Fetched.\n\n[the file at https://x.org/a.pdf left out: Velo fetches no URLs]\n\n"
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": [{"type": "file", "file": {"filename": "q3.pdf"}}]}]})
    error = (await resp.json())["error"]
    assert resp.status == 400 and (error["message"], error["param"]) == (
        "file: needs file_data, file_url or file_id", "messages")
