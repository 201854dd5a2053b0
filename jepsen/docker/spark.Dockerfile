# ledgermq-spark: the project's image plus a Java runtime and pip's pyspark (its jars include
# Spark Connect's), pandas and pyarrow, so one image runs a standalone master, a worker and a
# Spark Connect server whose Python workers can run the checker's code (it is installed).
#
# Built by `python -m jepsen.docker build-spark` with wheelhouse/spark/ as the build context
# (the wheels are prepared on the host; no package index is needed inside). The JRE comes
# from the base image's own Debian mirror, as the base image itself did.
ARG BASE_IMAGE=ledgermq:latest
FROM ${BASE_IMAGE}

# openjdk's postinst writes man-page links: the slim base removed /usr/share/man/man1
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java

COPY *.whl /wheelhouse/spark/
RUN /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /wheelhouse/spark pyspark pandas pyarrow \
    && rm -rf /wheelhouse \
    && /opt/ledgermq/bin/python -c "import pyspark, pandas, pyarrow, jepsen.checker.linear"

ENV JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/ledgermq/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/ledgermq/bin/python \
    SPARK_NO_DAEMONIZE=1
WORKDIR /tmp
CMD ["spark-class", "org.apache.spark.deploy.master.Master"]
