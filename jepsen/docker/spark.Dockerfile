# ledgermq-spark: a Java runtime, pip's pyspark (its jars include Spark Connect's), pandas and
# pyarrow, and the project (the checker's Python workers import it), so one image runs a
# standalone master, a worker and a Spark Connect server.
#
# Built by `python -m jepsen.docker build-spark` with wheelhouse/ as the build context (its
# wheels are prepared on the host; no package index is needed inside). The JRE comes from the
# base image's own Debian mirror, as the base image itself did. Layers go from the most stable
# to the least: the JRE and Spark layers stay cached while only the project changes.
ARG BASE_IMAGE=ledgermq-base:bookworm
FROM ${BASE_IMAGE}

# openjdk's postinst writes man-page links: the slim base removed /usr/share/man/man1
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java

COPY spark/*.whl /wheelhouse/spark/
RUN python3 -m venv /opt/ledgermq \
    && /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /wheelhouse/spark pyspark pandas pyarrow \
    && rm -rf /wheelhouse/spark

COPY deps/*.whl /wheelhouse/deps/
RUN /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /wheelhouse/deps xxhash zlib-ng uvloop prometheus-client click \
    && rm -rf /wheelhouse/deps

COPY ledgermq-*.whl /wheelhouse/
RUN /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check --no-deps \
        /wheelhouse/ledgermq-*.whl \
    && rm -rf /wheelhouse \
    && /opt/ledgermq/bin/python -c "import pyspark, pandas, pyarrow, jepsen.checker.linear_spark"

ENV PATH=/opt/ledgermq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/ledgermq/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/ledgermq/bin/python \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
CMD ["spark-class", "org.apache.spark.deploy.master.Master"]
