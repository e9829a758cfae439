"""`/docs` works offline: the Swagger UI page loads its script, stylesheet, icon and the OpenAPI
document from the gateway itself, and every one of those answers 200 without a token."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from tests.integration.bff_gateway.support import Gateway


class _References(HTMLParser):
    """Collects every src and href attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in {"src", "href"} and value]


def references(page: str) -> list[str]:
    """The page's src/href URLs and the `url:` its inline script hands Swagger UI."""
    parser = _References()
    parser.feed(page)
    return parser.urls + re.findall(r"""url:\s*['"]([^'"]+)['"]""", page)


async def test_docs_reference_only_the_gateways_own_urls(gateway_without_backend: Gateway) -> None:
    response = await gateway_without_backend.http.get("/docs")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    urls = references(response.text)
    assert sorted(urls) == [
        "/docs/assets/favicon.png",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui.css",
        "/openapi.json",
    ]
    assert "cdn" not in response.text.lower()


async def test_every_url_of_the_docs_page_answers(gateway_without_backend: Gateway) -> None:
    page = (await gateway_without_backend.http.get("/docs")).text
    expected_types = {
        "/docs/assets/favicon.png": "image/png",
        "/docs/assets/swagger-ui-bundle.js": "javascript",
        "/docs/assets/swagger-ui.css": "text/css",
        "/openapi.json": "application/json",
    }

    for url in references(page):
        answer = await gateway_without_backend.http.get(url)
        assert answer.status_code == 200, url
        assert expected_types[url] in answer.headers["content-type"], url
        assert len(answer.content) > 1_000, url


async def test_the_bundle_is_swagger_ui_5_which_renders_openapi_3_1(gateway_without_backend: Gateway) -> None:
    bundle = (await gateway_without_backend.http.get("/docs/assets/swagger-ui-bundle.js")).text
    document = (await gateway_without_backend.http.get("/openapi.json")).json()

    assert document["openapi"].startswith("3.1")
    assert "SwaggerUIBundle" in bundle
    assert re.search(r'"5\.\d+\.\d+"', bundle), "Swagger UI 4 cannot render an OpenAPI 3.1 document"


async def test_docs_are_not_part_of_the_api_document(gateway_without_backend: Gateway) -> None:
    document = (await gateway_without_backend.http.get("/openapi.json")).json()

    assert not [path for path in document["paths"] if path.startswith("/docs")]
