// /api/v1/docs: Swagger UI over the generated OpenAPI document, nothing fetched elsewhere.
(function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.url,
    domNode: root,
    deepLinking: true,
    validatorUrl: null, // the default sends the document to validator.swagger.io
    tryItOutEnabled: false,
    persistAuthorization: false,
  });
})();
